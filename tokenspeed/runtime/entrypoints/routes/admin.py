"""The admin routes: abort requests, flush the prefix cache."""

from __future__ import annotations

import asyncio

from fastapi import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.entrypoints.openai.errors import bad_request
from tokenspeed.runtime.entrypoints.routes.deps import Server, json_body, new_router

router = new_router()


@router.post("/abort_request")
async def abort_request(request: Request, state: Server) -> Response:
    body = await json_body(request)
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


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(state: Server) -> Response:
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
