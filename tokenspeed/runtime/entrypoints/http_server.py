"""The FastAPI application: OpenAI-compatible routes, the native API, health, info, metrics, admin.

Every route but `/health` needs `Authorization: Bearer <--api-key>` when a key is set (`/openapi.json`, the
schema of every route, included). Errors are OpenAI-style bodies (`openai.errors`); unknown routes answer
404 the same way. Bodies are held to `--max-request-bytes` and to valid JSON text (`request_body`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenspeed.config.support_check import assess
from tokenspeed.runtime.entrypoints.expert_api import add_expert_routes
from tokenspeed.runtime.entrypoints.http_outcomes import ResponseOutcomes
from tokenspeed.runtime.entrypoints.native_api import GENERATE_OPENAPI
from tokenspeed.runtime.entrypoints.native_api import generate as native_generate
from tokenspeed.runtime.entrypoints.openai.errors import APIError, bad_request, unavailable
from tokenspeed.runtime.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from tokenspeed.runtime.entrypoints.openai.serving_chat import create_chat_completion
from tokenspeed.runtime.entrypoints.openai.serving_completions import create_completion
from tokenspeed.runtime.entrypoints.request_body import BodyLimitMiddleware, BodyRefused, CheckedRoute
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger("tokenspeed.http")

_OPEN_PATHS = ("/health",)


class ApiKeyMiddleware:
    """Plain ASGI (not BaseHTTPMiddleware), so streaming responses and disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            response = APIError(401, "invalid or missing API key: send Authorization: Bearer <key>",
                                code="invalid_api_key").response()  # fmt: skip
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


async def _json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from exc


def _require_ready(state: ServerState) -> None:
    if not state.ready:
        raise unavailable(f"the server is {state.status}; retry shortly")


def _uncounted(status: int) -> None:
    return None


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(
        title="TokenSpeed", version=_version(), docs_url=None, redoc_url=None, openapi_url="/openapi.json"
    )
    app.router.route_class = CheckedRoute
    app.state.server = state
    max_bytes = state.server_args.max_request_bytes
    if max_bytes:
        app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes)
    # Added last, so it runs first: a client without the key is turned away before its body is read.
    if state.server_args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.server_args.api_key)
    # Outermost: counts every answer by status (refusals included) and adds Retry-After to 503s.
    app.add_middleware(ResponseOutcomes, count=state.metrics.on_http_response if state.metrics else _uncounted)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            where = next((p for p in first.get("loc", ()) if isinstance(p, int)), None)
            reason = (first.get("ctx") or {}).get("error", "JSON decode error")
            return bad_request(
                f"the body is not valid JSON: {reason}: character {where}", code="invalid_json"
            ).response()
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return bad_request(
            f"{loc}: {first.get('msg', 'invalid request')}" if loc else str(exc), param=loc or None
        ).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc, BodyRefused):
            return exc.api_error().response()
        if exc.status_code == 404:
            return APIError(404, f"no route {request.method} {request.url.path}", code="not_found").response()
        return APIError(exc.status_code, str(exc.detail)).response()

    # ---------------------------------------------------------------- OpenAI

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        _require_ready(state)
        return await create_chat_completion(state, req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        _require_ready(state)
        return await create_completion(state, req, request)

    @app.get("/v1/models")
    async def models() -> Response:
        limits = state.llm.limits
        data = [
            {
                "id": name,
                "object": "model",
                "created": int(state.started_at),
                "owned_by": "tokenspeed",
                "root": str(state.server_args.model),
                "max_model_len": limits.max_model_len if limits else None,
            }
            for name in state.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        if not state.accepts_model(model_id):
            raise APIError(
                404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found"
            )
        return JSONResponse({"id": model_id, "object": "model", "created": int(state.started_at),
                             "owned_by": "tokenspeed"})  # fmt: skip

    # ---------------------------------------------------------------- native

    @app.post("/generate", openapi_extra=GENERATE_OPENAPI)
    async def generate(request: Request) -> Response:
        _require_ready(state)
        return await native_generate(state, await _json_body(request), request)

    @app.get("/health")
    async def health() -> Response:
        if not state.ready:
            return JSONResponse({"status": state.status}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        _require_ready(state)
        ids = state.tokenizer.encode("ping") if state.tokenizer is not None else [1]
        params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)

        async def one() -> None:
            async for _ in state.llm.generate(ids, params, internal=True):
                pass

        try:
            await asyncio.wait_for(one(), timeout=20)
        except TimeoutError as exc:
            raise unavailable("a one-token generation did not finish within 20 s") from exc
        return JSONResponse({"status": "ok"})

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        limits = state.llm.limits
        return JSONResponse(
            {
                "model_path": str(state.server_args.model),
                "tokenizer_path": str(
                    state.server_args.tokenizer or state.server_args.model
                ),
                "served_model_name": state.model_name,
                "is_generation": True,
                "preferred_sampling_params": state.preferred_sampling_params,
                "max_model_len": limits.max_model_len if limits else None,
            }
        )

    # the flags accepted with no effect in this build (tokenspeed/config/support.py): fixed for the
    # server's life, so worked out once rather than on every poll
    no_effect_flags = list(assess(state.server_args).no_effect.values())

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        return JSONResponse({**_server_info(state), "no_effect_flags": no_effect_flags})

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            raise APIError(404, "metrics are off: start the server with --enable-metrics", code="not_found")
        from tokenspeed.runtime.metrics.collector import CONTENT_TYPE

        # Read at scrape time: requests held by the front end, wherever they are (queued, running, streaming).
        state.metrics.set_inflight(state.llm.num_inflight)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    # ---------------------------------------------------------------- admin

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise bad_request('send {"rid": ...} or {"abort_all": true}')
        if body.get("abort_all"):
            n = state.llm.num_inflight
            state.llm.abort_all()
            return JSONResponse({"aborted": n})
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise bad_request("rid: the id of the request to abort", param="rid")
        # An n > 1 or batched request runs as rid-0, rid-1, ...: abort them all.
        targets = [r for r in state.llm.request_ids() if r == rid or r.startswith(f"{rid}-")]
        for r in targets:
            state.llm.abort(r)
        return JSONResponse({"aborted": len(targets)})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        answers = await state.llm.rpc("flush_cache")
        # A scheduler refuses while it still holds requests; one just aborted or finished here may need a
        # step or two there to be released, so retry briefly when nothing is in flight on this side.
        for _ in range(10):
            if all(a.ok for a in answers) or state.llm.num_inflight:
                break
            await asyncio.sleep(0.1)
            answers = await state.llm.rpc("flush_cache")
        if not all(a.ok for a in answers):
            raise bad_request("cannot flush the cache while requests are running; retry when idle")
        return JSONResponse({"flushed": True, "groups": len(answers)})

    add_expert_routes(app, state)  # expert recording and rebalancing (expert_api)

    return app


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def _server_info(state: ServerState) -> dict[str, Any]:
    args = state.server_args.to_dict() if hasattr(state.server_args, "to_dict") else vars(state.server_args)
    args = {k: _jsonable(v) for k, v in args.items()}
    args.pop("api_key", None)  # a secret never leaves the process
    limits = state.llm.limits
    ranks = [dataclasses.asdict(s) for _, s in sorted(state.llm.rank_stats.items())]
    for r in ranks:
        r["kv_cache_usage_perc"] = r["kv_pages_used"] / r["kv_pages_total"] if r["kv_pages_total"] else 0.0
        r.pop("iteration_tokens", None)
    return {
        **args,
        "version": _version(),
        "status": state.status,
        "uptime_s": time.time() - state.started_at,
        "pid": os.getpid(),
        "child_pids": state.child_pids,
        "max_total_num_tokens": limits.max_total_tokens if limits else None,
        "max_req_input_len": limits.max_req_input_len if limits else None,
        "max_model_len": limits.max_model_len if limits else None,
        "num_inflight_requests": state.llm.num_inflight,
        "internal_states": ranks,
    }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tokenspeed")
    except Exception:
        return "unknown"
