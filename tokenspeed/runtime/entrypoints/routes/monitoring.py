"""The monitoring routes: health, one-token health check, model and server info, version, Prometheus metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.entrypoints.openai.errors import APIError, unavailable
from tokenspeed.runtime.entrypoints.routes.deps import Server, new_router, require_ready
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.sampling_params import SamplingParams

router = new_router()


@router.get("/health")
async def health(state: Server) -> Response:
    if not state.ready:
        return JSONResponse({"status": state.status}, status_code=503)
    # A hung scheduler leaves this process answering: without this the server would look healthy while
    # every request waits for ever (tokenspeed/runtime/engine/scheduler_liveness.py).
    stalled = state.llm.liveness.stalled
    if stalled is not None:
        return JSONResponse({"status": "stalled", "message": stalled}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/health_generate")
async def health_generate(state: Server) -> Response:
    require_ready(state)
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


@router.get("/get_model_info")
async def get_model_info(state: Server) -> Response:
    limits = state.llm.limits
    return JSONResponse(
        {
            "model_path": str(state.server_args.model),
            "tokenizer_path": str(state.server_args.tokenizer or state.server_args.model),
            "served_model_name": state.model_name,
            "is_generation": True,
            "preferred_sampling_params": state.preferred_sampling_params,
            "max_model_len": limits.max_model_len if limits else None,
        }
    )


@router.get("/version")
async def show_version() -> Response:
    # what vLLM's and SGLang's /version answer: the installed package's version
    return JSONResponse({"version": version()})


@router.get("/get_server_info")
async def get_server_info(request: Request, state: Server) -> Response:
    # no_effect_flags: fixed for the server's life, worked out once by build_app
    return JSONResponse({**server_info(state), "no_effect_flags": request.app.state.no_effect_flags})


@router.get("/metrics")
async def metrics(state: Server) -> Response:
    if state.metrics is None:
        raise APIError(404, "metrics are off: start the server with --enable-metrics", code="not_found")
    from tokenspeed.runtime.metrics.collector import CONTENT_TYPE

    # Read at scrape time: requests held by the front end, wherever they are (queued, running, streaming).
    state.metrics.set_inflight(state.llm.num_inflight)
    state.metrics.set_heartbeat_ages(state.llm.liveness.ages())
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def server_info(state: ServerState) -> dict[str, Any]:
    """The resolved ServerArgs (the API key left out) and the live state, as /get_server_info answers."""
    args = {k: _jsonable(v) for k, v in state.server_args.to_dict().items()}
    args.pop("api_key", None)  # a secret never leaves the process
    limits = state.llm.limits
    ranks = [dataclasses.asdict(s) for _, s in sorted(state.llm.rank_stats.items())]
    for r in ranks:
        r["kv_cache_usage_perc"] = r["kv_pages_used"] / r["kv_pages_total"] if r["kv_pages_total"] else 0.0
        r.pop("iteration_tokens", None)
        r.pop("spec_acceptance_lengths", None)  # per-step samples for /metrics; the mean is kept
    return {
        **args,
        "version": version(),
        "status": state.status,
        "uptime_s": time.time() - state.started_at,
        "pid": os.getpid(),
        "child_pids": state.child_pids,
        "max_total_num_tokens": limits.max_total_tokens if limits else None,
        "max_req_input_len": limits.max_req_input_len if limits else None,
        "max_model_len": limits.max_model_len if limits else None,
        "num_inflight_requests": state.llm.num_inflight,
        "scheduler_stalled": state.llm.liveness.stalled,
        "internal_states": ranks,
    }


def version() -> str:
    try:
        from importlib.metadata import version as installed

        return installed("tokenspeed")
    except Exception:
        return "unknown"
