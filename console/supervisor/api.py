"""The supervisor's control API: HTTP over the unix socket `<state_dir>/control.sock` (mode 0600).

Every answer is JSON (except raw_metrics: Prometheus text). Errors: 404 {"error"} for an unknown
server, 409 {"error"} while the fleet shuts down, 502 {"error"} when a proxied server does not answer.

    GET  /fleet                             {"name", "profile_path", "state_dir", "started_at",
                                             "supervisor_pid", "shutting_down", "servers": [Server],
                                             "load": Load | null, "events": the last 12 events of the
                                             last 10 minutes (as GET /events)}
         Server = {"name", "replica", "node", "gpus": [int], "host", "port", "url", "state", "pid",
                   "pids": [int], "started_at", "uptime_s", "restarts", "recent_restarts" (inside
                   restart_window_s), "last_exit": {"code", "signal", "at", "reason"} | null,
                   "healthy": bool, "error": str | null, "stalled_s": seconds without a scheduler
                   step while requests are in flight (then state is STALLED) | null,
                   "draining": {"since", "deadline", "in_flight"} | null (STOPPING: SIGTERM sent),
                   "metrics": {"running", "waiting", "kv_usage", "prefix_hit_rate", "gen_throughput",
                               "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "queue_p50", "queue_p99",
                               "requests_total", "errors_total", "errors" and "preemptions" (over
                               the window), "in_flight", "steps_total"} | null (null when the last
                               scrape is older than the running process),
                   "scraped_at": float | null,
                   "plan": {"kv_tokens", "gpu_memory_utilization", "cudagraph_capture_sizes", "fits",
                            "reason"} | null (what the server was last started with; null on the CPU),
                   "moe": bool | null (its model has experts; null: its config.json is not here)}
         last_exit.reason: "unhealthy" (stopped by the supervisor: UNHEALTHY too long), "exited while
         unsupervised; status unknown", "start failed: ..." (no process ran), or null when code/signal
         tell all.
         state is one of STARTING READY STALLED UNHEALTHY BACKOFF STOPPING STOPPED FATAL; times are
         Unix seconds; latency percentiles are seconds over the last `window_s` (30) seconds of scrapes
         (None: no requests). The fleet also says "metrics_interval_s", "stop_timeout_s", "window_s".
         Load = the profile's [load] generator (null without one): {"rate_per_s" (target), "sent",
                "ok", "errors", "skipped", "sent_per_s" (last minute), "last_error", "last_error_at"}
    GET  /servers/{name}                    Server
    GET  /servers/{name}/history?seconds=300  {"samples": [{"t", <metric keys as above>}]}
    GET  /servers/{name}/raw_metrics        the latest /metrics text of the server
    GET  /servers/{name}/info               the server's /get_server_info (proxied)
    GET  /servers/{name}/expert_placement   the server's GET /expert_placement (proxied): which EP rank holds
                                             which expert, and what the last rebalance changed
    GET  /servers/{name}/logs?lines=500     {"lines": [str]}
    GET  /events?seconds=300[&server=NAME]  {"events": [{"server", "t", "kind", "text"}]} oldest first; kind is
                                             start, exit, restart, kill, fatal, health, stall, drain, reload,
                                             rebalance or note (kept in history.sqlite, shown in replay)
    POST /servers/{name}/restart | /stop | /start          {"ok", "name", "state"}
    POST /servers/{name}/flush_cache                       the server's answer to POST /flush_cache
    POST /servers/{name}/expert_record/start | /stop       the server's start/stop_expert_distribution_record
    POST /servers/{name}/rebalance_experts                 the server's POST /rebalance_experts (one EPLB
                                                           rebalance now: balancedness before/after)
    POST /fleet/rolling_restart             {"ok", "servers"}: one at a time, each READY before the next
    POST /fleet/reload?dry_run=1            re-read and re-resolve the profile: {"ok", "dry_run", "profile_path",
                                             "servers": [{"name", "change": added|removed|changed|unchanged,
                                             "fields": {field: [before, after]}}], "fleet": {setting:
                                             [before, after]}, "restart", "start", "stop": [names],
                                             "message"}; without dry_run it is applied (changed servers by a
                                             rolling restart). 422 {"error"} when the profile does not
                                             resolve or cannot be applied: the running fleet is untouched
    POST /shutdown                          {"ok"}: stop every server, then the supervisor exits
    GET  /probe                             {"probe": {...GPU readings...}, "owners": [GpuOwners], "plan": {...}
                                             | null, "error"}: the plan of a restart now (own servers'
                                             memory counted free); GpuOwners = {"index", "own": {server:
                                             MiB}, "other_fleets": {"fleet/server": MiB}, "unknown": {pid: MiB}}
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from console.profile.fleet import ProfileError, load_and_resolve
from console.supervisor.core import Supervisor, UnknownServer

_PROXIED = {
    "flush_cache": ("POST", "/flush_cache"),
    "expert_record/start": ("POST", "/start_expert_distribution_record"),
    "expert_record/stop": ("POST", "/stop_expert_distribution_record"),
    "rebalance_experts": ("POST", "/rebalance_experts"),
}
# A rebalance waits for the server's step in flight, then moves expert weights between its ranks.
_PROXY_TIMEOUT_S = {"rebalance_experts": 120.0}


def unknown_server_message(name: str, fleet: str, servers: list[str]) -> str:
    """`no server named 'demo-0' in fleet 'demo' (did you mean ...?); its servers: ...`: the real names."""
    from console.profile.toml import did_you_mean

    return (
        f"no server named {name!r} in fleet {fleet!r}{did_you_mean(name, servers)}; "
        f"its servers: {', '.join(servers) or 'none'}"
    )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build_app(sup: Supervisor) -> Starlette:
    def guarded(handler):
        async def wrapper(request: Request):
            try:
                return await handler(request)
            except UnknownServer as exc:
                return _error(404, unknown_server_message(exc.args[0], sup.fleet.name, list(sup.units)))
            except RuntimeError as exc:
                return _error(409, str(exc))
            except httpx.HTTPError as exc:
                return _error(502, f"the server did not answer: {exc!r}")
            except ValueError as exc:
                return _error(400, str(exc))

        return wrapper

    async def fleet(request: Request):
        return JSONResponse(sup.fleet_json())

    async def server(request: Request):
        return JSONResponse(sup.server_json(sup.unit(request.path_params["name"]), time.time()))

    async def history(request: Request):
        seconds = float(request.query_params.get("seconds", 300))
        return JSONResponse({"samples": sup.history_since(request.path_params["name"], seconds)})

    async def raw_metrics(request: Request):
        name = request.path_params["name"]
        sup.unit(name)
        return PlainTextResponse(sup.scraped[name].raw)

    async def info(request: Request):
        response = await sup.proxy(request.path_params["name"], "GET", "/get_server_info")
        return JSONResponse(response.json(), status_code=response.status_code)

    async def expert_placement(request: Request):
        response = await sup.proxy(request.path_params["name"], "GET", "/expert_placement")
        return JSONResponse(response.json(), status_code=response.status_code)

    async def events(request: Request):
        seconds = float(request.query_params.get("seconds", 300))
        server = request.query_params.get("server")
        if server is not None:
            sup.unit(server)
        return JSONResponse({"events": sup.history.events(time.time() - seconds, server=server)})

    async def logs(request: Request):
        lines = int(request.query_params.get("lines", 500))
        return JSONResponse({"lines": sup.logs(request.path_params["name"], lines)})

    async def action(request: Request):
        name, verb = request.path_params["name"], request.path_params["action"]
        if verb in ("restart", "stop", "start"):
            return JSONResponse(sup.command(name, verb))
        if verb in _PROXIED:
            method, path = _PROXIED[verb]
            response = await sup.proxy(name, method, path, timeout=_PROXY_TIMEOUT_S.get(verb, 10.0))
            try:
                body = response.json()
            except ValueError:
                body = {"text": response.text}
            return JSONResponse(body, status_code=response.status_code)
        return _error(404, f"no action {verb!r}; use restart, stop, start, " + ", ".join(_PROXIED))

    async def rolling_restart(request: Request):
        if sup.shutting_down:
            raise RuntimeError("the fleet is shutting down")
        return JSONResponse(sup.rolling_restart())

    async def reload(request: Request):
        dry_run = request.query_params.get("dry_run", "0") not in ("0", "", "false")
        try:
            new = await asyncio.to_thread(_resolve_again, sup.resolved.profile.path)
            return JSONResponse(sup.reload(new, dry_run=dry_run))
        except (ProfileError, ValueError) as exc:  # ReloadRefused is a ValueError
            return _error(422, f"{exc}\nthe running fleet is unchanged")

    async def shutdown(request: Request):
        sup.shutdown()
        return JSONResponse({"ok": True})

    async def probe(request: Request):
        return JSONResponse(await asyncio.to_thread(sup.gpu_view))

    routes = [
        Route("/fleet", guarded(fleet)),
        Route("/servers/{name}", guarded(server)),
        Route("/servers/{name}/history", guarded(history)),
        Route("/servers/{name}/raw_metrics", guarded(raw_metrics)),
        Route("/servers/{name}/info", guarded(info)),
        Route("/servers/{name}/expert_placement", guarded(expert_placement)),
        Route("/servers/{name}/logs", guarded(logs)),
        Route("/events", guarded(events)),
        Route("/servers/{name}/{action:path}", guarded(action), methods=["POST"]),
        Route("/fleet/rolling_restart", guarded(rolling_restart), methods=["POST"]),
        Route("/fleet/reload", guarded(reload), methods=["POST"]),
        Route("/shutdown", guarded(shutdown), methods=["POST"]),
        Route("/probe", guarded(probe)),
    ]
    return Starlette(routes=routes)


def _resolve_again(path: Path):
    """The profile as it is on disk now, resolved like the daemon resolved it at start."""
    from console.probe import probe_gpus
    from console.profile.plan import platform_facts

    return load_and_resolve(path, platform_facts(probe_gpus()))


def bind_socket(path: Path) -> socket.socket:
    """The control socket, created 0600 from the start (umask), never world-accessible for a moment."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the supervisor decides what SIGTERM means."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve_api(sup: Supervisor, sock: socket.socket) -> _QuietServer:
    config = uvicorn.Config(build_app(sup), log_level="warning", lifespan="off", access_log=False)
    server = _QuietServer(config)
    await server.serve(sockets=[sock])
    return server
