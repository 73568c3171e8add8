"""What the control API says about the fleet and each server (the JSON of GET /fleet and /servers/NAME).

A server's `state` is its unit's state, except that a READY or UNHEALTHY server whose scheduler has run
no step while requests are in flight, or sent no heartbeat, for `[supervisor] stall_after_s` reads STALLED
(its HTTP front end still answers, so the state machine alone would say READY). A STALLED server is
restarted after `unhealthy_restart_after_s` (unit.py). Metrics are only those of the running
process: a scrape older than the process's start is not shown as its values.
"""

from __future__ import annotations

import os
import time

from console.profile.plan import ServerPlan
from console.supervisor.scrapes import WINDOW_S
from console.supervisor.states import State

EVENTS_SECONDS, EVENTS_SHOWN = 600.0, 12

STALLED = "STALLED"


def _current(sup, unit) -> bool:
    """Whether the latest scrape is of the server's running process."""
    scraped = sup.scraped[unit.spec.name]
    running = unit.state.has_process and unit.started_at is not None
    return running and scraped.scraped_at is not None and scraped.scraped_at >= unit.started_at


def stalled_for(sup, unit, now: float) -> float | None:
    # UNHEALTHY too: a stalled server's own /health fails after a while, and STALLED says more.
    if unit.state not in (State.READY, State.UNHEALTHY) or not _current(sup, unit):
        return None
    return sup.scraped[unit.spec.name].stalled_for(now, sup.resolved.profile.supervisor.stall_after_s)


def display_state(sup, unit, now: float) -> str:
    return STALLED if stalled_for(sup, unit, now) is not None else unit.state.value


def moe_of(sup, spec) -> bool | None:
    """Whether the server's model routes tokens to experts (the console's Experts screen says which servers
    have any), from its config.json, read once per model; None when the config is not on this machine."""
    from console.profile.model import is_moe

    model = str(dict(spec.processes[0].fields).get("model") or "")
    if model not in sup.moe_by_model:
        sup.moe_by_model[model] = is_moe(model) if model else None
    return sup.moe_by_model[model]


def server_json(sup, unit, now: float) -> dict:
    spec = unit.spec
    running = unit.state.has_process and unit.started_at is not None
    scraped = sup.scraped[spec.name]
    current = _current(sup, unit)
    metrics = scraped.summary if current else None
    stalled_s = stalled_for(sup, unit, now)
    state = STALLED if stalled_s is not None else unit.state.value
    draining = None
    if unit.state == State.STOPPING and unit.stopping_since is not None:
        draining = {
            "since": unit.stopping_since,
            "deadline": unit.stopping_since + unit.fleet.stop_timeout_s,
            "in_flight": (metrics or {}).get("in_flight"),
        }
    return {
        "name": spec.name,
        "replica": spec.replica,
        "node": spec.node,
        "gpus": list(spec.gpus),
        "host": spec.host,
        "port": spec.port,
        "url": spec.url,
        "state": state,
        "pid": unit.handles[0].pid if unit.handles else None,
        "pids": [h.pid for h in unit.handles],
        "started_at": unit.started_at if running else None,
        "uptime_s": round(now - unit.started_at, 3) if running else None,
        "restarts": unit.restarts,
        # Restarts inside restart_window_s: two or more while STARTING or in BACKOFF is a crash loop.
        "recent_restarts": unit.policy.recent_restarts(now),
        "last_exit": unit.last_exit.to_dict() if unit.last_exit else None,
        "healthy": unit.state == State.READY and stalled_s is None,
        "error": unit.error,
        "stalled_s": round(stalled_s, 1) if stalled_s is not None else None,
        "draining": draining,
        "metrics": metrics,
        "scraped_at": scraped.scraped_at if current else None,
        "plan": _plan_json(sup.plans.planned(spec.name)),
        "moe": moe_of(sup, spec),
        # Every process of the server: {"pid", "name", "cpu_percent", "rss_mib", "gpu_mib", "gpu_sm_percent"}.
        "processes": [p.to_json() for p in sup.resources.usage.get(spec.name, [])] if running else [],
    }


def fleet_json(sup) -> dict:
    now = time.time()
    return {
        "name": sup.fleet.name,
        "profile_path": str(sup.resolved.profile.path),
        "state_dir": str(sup.paths.root),
        "started_at": sup.started_at,
        "supervisor_pid": os.getpid(),
        "shutting_down": sup.shutting_down,
        "metrics_interval_s": sup.fleet.metrics_interval_s,
        "stop_timeout_s": sup.fleet.stop_timeout_s,
        "window_s": WINDOW_S,
        # The latest events (the console's events pane), so it needs no request of its own.
        "events": sup.history.events(now - EVENTS_SECONDS)[-EVENTS_SHOWN:],
        "servers": [server_json(sup, u, now) for u in sup.units.values()],
        "load": sup.load.report().to_json() if sup.load is not None else None,
    }


def _plan_json(plan: ServerPlan | None) -> dict | None:
    """The planned values a running server reports back in /get_server_info (the Server screen's
    "planned X, running X")."""
    if plan is None or plan.device == "cpu":
        return None
    return {
        "kv_tokens": plan.kv_tokens,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "cudagraph_capture_sizes": plan.cudagraph_capture_sizes,
        "fits": plan.fits,
        "reason": plan.reason,
    }
