"""The FastAPI application: the routers of `routes/`, with the middlewares and error handlers they share.

Every route but `/health` needs `Authorization: Bearer <--api-key>` when a key is set (`/openapi.json`, the
schema of every route, included). Errors are OpenAI-style bodies (`openai.errors`); unknown routes answer
404 the same way. Bodies are held to `--max-request-bytes` and to valid JSON text (`request_body`).
"""

from __future__ import annotations

import hmac
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenspeed.config.api_key import bearer_token
from tokenspeed.config.support_check import assess
from tokenspeed.runtime.entrypoints.http_outcomes import ResponseOutcomes
from tokenspeed.runtime.entrypoints.openai.errors import APIError, bad_request
from tokenspeed.runtime.entrypoints.request_body import BodyLimitMiddleware, BodyRefused, CheckedRoute
from tokenspeed.runtime.entrypoints.routes import (
    admin,
    experts,
    monitoring,
    native_routes,
    openai_routes,
    tokenize,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState

_OPEN_PATHS = ("/health",)
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|[a-z-]+\[.*\])$")


def field_path(loc: tuple) -> str:
    """A validation error's location as the client writes it: `messages[0].role`."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif not path:
            path = str(part)
        elif _UNION_MEMBER.match(str(part)):
            continue  # pydantic's name of a union member it tried, not a field of the body
        else:
            path += f".{part}"
    return path


class ApiKeyMiddleware:
    """Plain ASGI (not BaseHTTPMiddleware), so streaming responses and disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        # The scheme in any case (RFC 7235), as the supervisor's own metrics route accepts it.
        token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        if token is None or not hmac.compare_digest(token.encode("latin-1"), self.expected):
            response = APIError(401, "invalid or missing API key: send Authorization: Bearer <key>",
                                code="invalid_api_key").response()  # fmt: skip
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _uncounted(status: int) -> None:
    return None


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(
        title="TokenSpeed",
        version=monitoring.version(),
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.router.route_class = CheckedRoute
    app.state.server = state
    # the flags accepted with no effect in this build (tokenspeed/config/support.py): fixed for the
    # server's life, so worked out once rather than on every /get_server_info poll
    app.state.no_effect_flags = list(assess(state.server_args).no_effect.values())
    max_bytes = state.server_args.max_request_bytes
    if max_bytes:
        app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes)
    # Added last, so it runs first: a client without the key is turned away before its body is read.
    if state.server_args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.server_args.api_key)
    # Outermost: counts every answer by status (refusals included) and adds Retry-After to 503s.
    app.add_middleware(
        ResponseOutcomes, count=state.metrics.on_http_response if state.metrics else _uncounted
    )

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
        loc = field_path(first.get("loc", ()))
        if not loc:
            # the body as a whole: never str(exc), which carries the handler's source file and line
            what = "is empty" if first.get("type") == "missing" else "must be a JSON object"
            return bad_request(f"the body {what}: send the request's fields as a JSON object").response()
        return bad_request(f"{loc}: {first.get('msg', 'invalid request')}", param=loc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc, BodyRefused):
            return exc.api_error().response()
        if exc.status_code == 404:
            return APIError(404, f"no route {request.method} {request.url.path}", code="not_found").response()
        return APIError(exc.status_code, str(exc.detail)).response()

    for module in (openai_routes, native_routes, tokenize, monitoring, admin, experts):
        app.include_router(module.router)
    return app
