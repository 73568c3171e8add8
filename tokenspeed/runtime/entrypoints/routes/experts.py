"""The MoE expert routes: recording the expert load and rebalancing the experts on demand.

    POST|GET /start_expert_distribution_record   a user's recording session starts (the window restarts)
    POST|GET /stop_expert_distribution_record    the session stops; `recording` says whether the recorder
                                                 still counts (`reason`: the flag that needs the load)
    POST|GET /dump_expert_distribution_record    the session's load (or the live window), also saved to a file
    POST     /rebalance_experts                  one EPLB rebalance now, between two steps, from the
                                                 recorded load: balancedness before/after, what moved
    GET      /expert_placement                   read-only: which slot of which EP rank holds which logical
                                                 expert now, and the last rebalance (what it changed)

Every DP group answers; `results` holds one answer per group. A call the server cannot honour (no MoE
expert parallelism, nothing recorded) is an OpenAI-style 400 naming the fix.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.slices import ExpertPlan
from tokenspeed.runtime.entrypoints.openai.errors import APIError, bad_request
from tokenspeed.runtime.entrypoints.routes.deps import Server, new_router

EXPERT_RECORD = (
    "start_expert_distribution_record",
    "stop_expert_distribution_record",
    "dump_expert_distribution_record",
)
# A rebalance waits for the step in flight, then moves expert weights between ranks.
_REBALANCE_TIMEOUT_S = 120.0


def _expert_record_route(method: str):
    # One route per recorder call, each named after it (its /openapi.json operation).
    async def route(request: Request, state: Server) -> Response:
        body = await request.body()
        try:
            args = json.loads(body) if body.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"the body is not valid JSON: {exc}") from exc
        if not isinstance(args, dict):
            raise bad_request("the body must be a JSON object")
        answers = await state.llm.rpc(method, args)
        failed = [a for a in answers if not a.ok]
        if failed:
            raise bad_request(failed[0].error or f"{method} failed", code="not_enabled")
        results = [a.result for a in answers]
        if method == "stop_expert_distribution_record":
            return JSONResponse(stop_answer(state.server_args, results))
        return JSONResponse({"ok": True, "results": results})

    route.__name__ = method
    return route


def stop_answer(server_args: ServerArgs, results: list[dict]) -> dict[str, Any]:
    """The stop route's answer: the session stopped; whether the recorder still counts, and why."""
    recording = any(bool(r.get("recording")) for r in results)
    out: dict[str, Any] = {"ok": True, "recording": recording}
    if recording:
        out["reason"] = (
            ExpertPlan.from_server_args(server_args).kept_by
            or "the expert recorder is kept on by this server"
        )
        out["note"] = (
            "the recording session stopped: /dump_expert_distribution_record returns the load recorded "
            "between start and stop, while the recorder goes on counting for the reason above"
        )
    out["results"] = results
    return out


router = new_router()
for _method in EXPERT_RECORD:
    router.add_api_route(f"/{_method}", _expert_record_route(_method), methods=["GET", "POST"])


@router.post("/rebalance_experts")
async def rebalance_experts(state: Server) -> Response:
    answers = await state.llm.rpc("rebalance_experts", timeout=_REBALANCE_TIMEOUT_S)
    failed = [a for a in answers if not a.ok]
    if failed:
        message = failed[0].error or "rebalance_experts failed"
        if all(a.refused for a in failed):
            raise bad_request(message, code=failed[0].refused)
        raise APIError(500, message, code="rebalance_failed")
    return JSONResponse(rebalance_answer([a.result for a in answers]))


@router.get("/expert_placement")
async def expert_placement(state: Server) -> Response:
    """The first DP group's placement as top-level fields; every group's in `results`."""
    answers = await state.llm.rpc("expert_placement")
    failed = [a for a in answers if not a.ok]
    if failed:
        raise bad_request(failed[0].error or "expert_placement failed", code="not_enabled")
    results = [a.result for a in answers]
    return JSONResponse({"ok": True, **(results[0] if results else {}), "results": results})


def rebalance_answer(results: list[dict]) -> dict[str, Any]:
    """The first DP group's rebalance as top-level fields (one group is the usual case), all in `results`."""
    first = results[0] if results else {}
    last = first.get("last") or {}
    before = list(last.get("balancedness_before") or [])
    after = list(last.get("balancedness_after") or [])
    return {
        "ok": True,
        "rebalances": first.get("rebalances", 0),
        "layers": last.get("layers", []),
        "balancedness_before": before,
        "balancedness_after": after,
        "balancedness_before_mean": round(sum(before) / len(before), 4) if before else None,
        "balancedness_after_mean": round(sum(after) / len(after), 4) if after else None,
        "moved_slots": last.get("moved_slots", 0),
        "moved_experts": last.get("moved_experts", []),
        "replicas": last.get("replicas", []),
        "changes": last.get("changes", []),
        "window_tokens": last.get("tokens", 0),
        "window_passes": last.get("passes", 0),
        "seconds": last.get("seconds"),
        "results": results,
    }
