"""The supervisor's own Prometheus metrics: what only it knows about the fleet (states, restarts, backoff).

Names carry the `tokenspeed_fleet:` prefix; per-server series have a `server` label (the supervisor's
target adds `fleet` and `role="supervisor"`):

    tokenspeed_fleet:server_state{server,state}          1 for the state the server is in, 0 for the others
                                                          (the state `tokenspeed status` shows: STALLED too)
    tokenspeed_fleet:server_restarts_total{server,reason} restarts: exit_code | signal | startup_timeout |
                                                          unhealthy | stalled | start_failed | unknown |
                                                          operator; kept in the state file, so a new
                                                          supervisor of the fleet counts on from there
    tokenspeed_fleet:server_backoff_seconds{server}      seconds left before a BACKOFF server starts again
    tokenspeed_fleet:server_last_start_time_seconds{server}  Unix time of the server's latest start
    tokenspeed_fleet:health_check_seconds{server}        health-check latency (histogram)
    tokenspeed_fleet:health_check_failures_total{server} failed health checks
    tokenspeed_fleet:servers{state}                      servers per state (fleet totals)
    process_*                                            the supervisor process itself

Restarts are counted by watching the units after each change (`observe`), never by editing the state
machine: a rise of `unit.restarts` is a restart the policy scheduled (its reason from the exit), a new
start without one is an operator's restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "tokenspeed_fleet:"
RESTART_REASONS = (
    "exit_code",
    "signal",
    "startup_timeout",
    "unhealthy",
    "stalled",
    "start_failed",
    "unknown",
    "operator",
)
STATES = ("STARTING", "READY", "STALLED", "UNHEALTHY", "BACKOFF", "STOPPING", "STOPPED", "FATAL")
_HEALTH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def restart_reason(unit: Any) -> str:
    """Why the policy restarts a unit that just failed, from what the unit recorded."""
    exit_info = unit.last_exit
    if getattr(exit_info, "reason", None) in ("unhealthy", "stalled"):
        return exit_info.reason  # the supervisor stopped a hung server
    if (unit.error or "").startswith("not healthy within"):
        return "startup_timeout"
    if exit_info is None or (exit_info.code is None and exit_info.signal is None):
        # No status: the start itself failed, or (with a reason) the process was one this supervisor
        # adopted or could not watch, so how it ended is not known.
        return "unknown" if getattr(exit_info, "reason", None) else "start_failed"
    return "signal" if exit_info.signal else "exit_code"


@dataclass
class _Seen:
    restarts: int
    started_at: float | None
    policy_start_due: bool = False  # the policy scheduled a start: the next new start is that one


class _UnitGauges:
    """Gauges computed at scrape time from the units, so they can never disagree with the state file."""

    def __init__(self, units: dict[str, Any], state_of: Callable[[Any], str]):
        self.units = units
        self.state_of = state_of

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        now = time.time()
        state = GaugeMetricFamily(
            PREFIX + "server_state", "1 for the server's current state.", labels=["server", "state"]
        )
        backoff = GaugeMetricFamily(
            PREFIX + "server_backoff_seconds",
            "Seconds before a BACKOFF server starts again.",
            labels=["server"],
        )
        started = GaugeMetricFamily(
            PREFIX + "server_last_start_time_seconds",
            "Unix time of the server's latest start.",
            labels=["server"],
        )
        totals = GaugeMetricFamily(
            PREFIX + "servers", "Servers of the fleet in each state.", labels=["state"]
        )
        counts = dict.fromkeys(STATES, 0)
        for name, unit in self.units.items():
            current = self.state_of(unit)
            counts[current] = counts.get(current, 0) + 1
            for s in STATES:
                state.add_metric([name, s], 1.0 if s == current else 0.0)
            next_start = unit.timers.next_start_at if current == "BACKOFF" else None
            backoff.add_metric([name], max(next_start - now, 0.0) if next_start else 0.0)
            if unit.started_at is not None:
                started.add_metric([name], unit.started_at)
        for s, n in counts.items():
            totals.add_metric([s], n)
        return [state, backoff, started, totals]


class _RestartCounts:
    """Restarts by (server, reason), a counter Prometheus reads from a plain dict: the dict is saved in the
    state file and handed to the next supervisor, so the count does not fall to 0 when the supervisor
    restarts (the dashboard's "Restarts by reason" agrees with `tokenspeed status`)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], float] = {}

    def inc(self, server: str, reason: str, by: float = 1.0) -> None:
        self.counts[(server, reason)] = self.counts.get((server, reason), 0.0) + by

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        family = CounterMetricFamily(
            PREFIX + "server_restarts", "Server restarts, by reason.", labels=["server", "reason"]
        )
        for (server, reason), value in sorted(self.counts.items()):
            family.add_metric([server, reason], value)
        return [family]


class FleetMetrics:
    def __init__(self, units: dict[str, Any], state_of: Callable[[Any], str] | None = None):
        self.units = units
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(_UnitGauges(units, state_of or (lambda unit: unit.state.value)))
        self.restarts = _RestartCounts()
        self.registry.register(self.restarts)
        self.health = Histogram(
            PREFIX + "health_check_seconds",
            "Latency of the supervisor's health checks.",
            ["server"],
            buckets=_HEALTH_BUCKETS,
            registry=self.registry,
        )
        self.health_failures = Counter(
            PREFIX + "health_check_failures", "Failed health checks.", ["server"], registry=self.registry
        )
        self._seen: dict[str, _Seen] = {}
        for name in units:
            self._init_series(name)

    def _init_series(self, name: str) -> None:
        """Every series of a server exists from its first scrape (at 0): "no restarts" is a 0, not a gap."""
        self.health.labels(server=name)
        self.health_failures.labels(server=name)
        for reason in RESTART_REASONS:
            self.restarts.inc(name, reason, 0.0)

    def saved_restarts(self) -> list[list]:
        """[[server, reason, count], ...] for the state file (only the non-zero counts)."""
        return [[s, r, n] for (s, r), n in sorted(self.restarts.counts.items()) if n]

    def restore_restarts(self, saved: list | None) -> None:
        """Counts an earlier supervisor of this fleet saved: this one counts on from them."""
        for row in saved or []:
            try:
                server, reason, count = str(row[0]), str(row[1]), float(row[2])
            except (IndexError, TypeError, ValueError):
                continue  # a state file from an older version, or hand-edited: skip what is not a count
            if server in self.units and count > 0:
                self.restarts.counts[(server, reason)] = count

    def observe(self) -> None:
        """Count the restarts that happened since the last call (called after every state change)."""
        for name, unit in self.units.items():
            seen = self._seen.get(name)
            if seen is None:
                self._init_series(name)  # also a server a profile reload added
                # The first look sets the baseline (restarts of an earlier supervisor are its history).
                self._seen[name] = _Seen(unit.restarts, unit.started_at)
                continue
            new_start = unit.started_at is not None and unit.started_at != seen.started_at
            if unit.restarts > seen.restarts:
                self.restarts.inc(name, restart_reason(unit), unit.restarts - seen.restarts)
                seen.policy_start_due = not new_start
            elif new_start:
                if seen.policy_start_due:
                    seen.policy_start_due = False
                elif seen.started_at is not None:
                    self.restarts.inc(name, "operator")
            seen.restarts, seen.started_at = unit.restarts, unit.started_at

    def observe_health(self, name: str, seconds: float, ok: bool) -> None:
        self.health.labels(server=name).observe(seconds)
        if not ok:
            self.health_failures.labels(server=name).inc()

    def render(self) -> bytes:
        self.observe()
        return generate_latest(self.registry)
