"""Typed views of what the supervisor reports, parsed once at the data-source boundary.

Screens only ever see these dataclasses, never raw JSON, so a renamed key breaks one parser
instead of six screens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The metric keys of the control API: one list, shared with the supervisor that fills them.
from console.metrics_math import METRIC_KEYS
from console.supervisor.load_report import LoadReport

# The events a fleet answer carries: the last few of the last ten minutes (the fleet screen's pane).
EVENTS_SECONDS = 600.0
EVENTS_SHOWN = 12

STATES = ("STARTING", "READY", "STALLED", "UNHEALTHY", "BACKOFF", "STOPPING", "STOPPED", "FATAL")


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Metrics:
    """The scraped gauges of one server; None where the server did not export the value."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_hit_rate: float | None = None
    gen_throughput: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    queue_p50: float | None = None  # arrival to first scheduled
    queue_p99: float | None = None
    requests_total: float | None = None
    errors_total: float | None = None
    errors: float | None = None  # HTTP 4xx/5xx and aborts over the window
    preemptions: float | None = None  # over the window
    in_flight: float | None = None
    steps_total: float | None = None
    heartbeat_age: float | None = None  # seconds since the least recently heard scheduler rank reported
    balancedness: float | None = None  # EPLB, the least balanced MoE layer (None: no MoE)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Metrics | None:
        if not isinstance(data, dict):
            return None
        return cls(**{key: _num(data.get(key)) for key in METRIC_KEYS})


@dataclass(frozen=True)
class LastExit:
    code: int | None
    signal: int | str | None
    at: float | None
    reason: str | None = None  # "unhealthy", "exited while unsupervised; status unknown", ...

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LastExit | None:
        if not isinstance(data, dict):
            return None
        reason = data.get("reason")
        return cls(
            code=data.get("code"),
            signal=data.get("signal"),
            at=_num(data.get("at")),
            reason=str(reason) if reason else None,
        )

    def describe(self) -> str:
        if self.signal not in (None, 0, ""):
            how = f"signal {self.signal}"
        elif self.code is not None:
            how = f"exit {self.code}"
        else:
            return self.reason or "-"
        return f"{how} ({self.reason})" if self.reason else how


@dataclass(frozen=True)
class Server:
    name: str
    replica: int | None
    node: str
    gpus: tuple[int, ...]
    host: str
    port: int | None
    url: str
    state: str
    pid: int | None
    started_at: float | None
    uptime_s: float | None
    restarts: int
    last_exit: LastExit | None
    healthy: bool
    error: str | None
    metrics: Metrics | None
    scraped_at: float | None
    # The supervisor's plan this server was started with: kv_tokens, gpu_memory_utilization,
    # cudagraph_capture_sizes (None on the CPU).
    plan: dict[str, Any] | None = None
    recent_restarts: int = 0  # inside the restart window: 2 or more while starting is a crash loop
    stalled_s: float | None = None  # no scheduler step for this long with requests in flight
    draining: dict[str, Any] | None = None  # STOPPING: {"since", "deadline", "in_flight"}
    # Every process of the server: {"pid", "name", "cpu_percent", "rss_mib", "gpu_mib", "gpu_sm_percent"}
    processes: tuple[dict[str, Any], ...] = ()
    moe: bool | None = None  # its model has experts (None: not known, an older supervisor or a replay)

    @property
    def crash_looping(self) -> bool:
        return self.state in ("BACKOFF", "STARTING") and self.recent_restarts >= 2

    @property
    def in_flight(self) -> int | None:
        value = self.metrics.in_flight if self.metrics is not None else None
        return int(value) if value is not None else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Server:
        gpus = data.get("gpus") or []
        return cls(
            name=str(data.get("name", "?")),
            replica=data.get("replica"),
            node=str(data.get("node") or "local"),
            gpus=tuple(int(g) for g in gpus if isinstance(g, (int, float, str)) and str(g).isdigit()),
            host=str(data.get("host") or ""),
            port=data.get("port"),
            url=str(data.get("url") or ""),
            state=str(data.get("state") or "UNKNOWN").upper(),
            pid=data.get("pid"),
            started_at=_num(data.get("started_at")),
            uptime_s=_num(data.get("uptime_s")),
            restarts=int(data.get("restarts") or 0),
            last_exit=LastExit.from_json(data.get("last_exit")),
            healthy=bool(data.get("healthy")),
            error=data.get("error") or None,
            metrics=Metrics.from_json(data.get("metrics")),
            scraped_at=_num(data.get("scraped_at")),
            plan=data.get("plan") if isinstance(data.get("plan"), dict) else None,
            recent_restarts=int(data.get("recent_restarts") or 0),
            stalled_s=_num(data.get("stalled_s")),
            draining=data.get("draining") if isinstance(data.get("draining"), dict) else None,
            processes=tuple(p for p in data.get("processes") or [] if isinstance(p, dict)),
            moe=data.get("moe") if isinstance(data.get("moe"), bool) else None,
        )

    @property
    def health(self) -> str:
        """One word the fleet table colours by: ok, warn, bad or off."""
        if self.state in ("FATAL", "UNHEALTHY", "STALLED") or self.crash_looping:
            return "bad"
        if self.state == "READY":
            return "ok" if self.healthy and not self.error else "bad"
        if self.state == "STOPPED":
            return "off"
        return "warn"


@dataclass(frozen=True)
class Fleet:
    name: str
    profile_path: str | None
    state_dir: str
    started_at: float | None
    servers: tuple[Server, ...]
    load: LoadReport | None = None  # the built-in load generator's counts, when the profile has [load]
    metrics_interval_s: float = 1.0  # how often the supervisor scrapes
    stop_timeout_s: float | None = None  # how long a stop drains before SIGKILL
    window_s: float = 30.0  # what rates, percentiles and error counts cover
    events: tuple[
        dict[str, Any], ...
    ] = ()  # the latest events, oldest first: {"server", "t", "kind", "text"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fleet:
        return cls(
            name=str(data.get("name") or "?"),
            profile_path=data.get("profile_path"),
            state_dir=str(data.get("state_dir") or ""),
            started_at=_num(data.get("started_at")),
            servers=tuple(Server.from_json(s) for s in data.get("servers") or [] if isinstance(s, dict)),
            load=LoadReport.from_json(data.get("load")),
            metrics_interval_s=_num(data.get("metrics_interval_s")) or 1.0,
            stop_timeout_s=_num(data.get("stop_timeout_s")),
            window_s=_num(data.get("window_s")) or 30.0,
            events=tuple(e for e in data.get("events") or [] if isinstance(e, dict)),
        )

    @property
    def window_label(self) -> str:
        """The window every screen names next to its rates and percentiles, e.g. "30s"."""
        return f"{self.window_s:g}s" if self.window_s < 120 else f"{self.window_s / 60:g}m"

    def server(self, name: str | None) -> Server | None:
        for server in self.servers:
            if server.name == name:
                return server
        return None


@dataclass(frozen=True)
class Sample:
    """One point of a server's metrics history."""

    t: float
    metrics: Metrics

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample | None:
        t = _num(data.get("t"))
        metrics = Metrics.from_json(data)
        if t is None or metrics is None:
            return None
        return cls(t=t, metrics=metrics)


@dataclass(frozen=True)
class History:
    samples: tuple[Sample, ...] = field(default_factory=tuple)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> History:
        rows = (data or {}).get("samples") or []
        parsed = (Sample.from_json(r) for r in rows if isinstance(r, dict))
        return cls(samples=tuple(s for s in parsed if s is not None))

    def series(self, key: str) -> list[float]:
        """The values of one metric, oldest first, skipping gaps (a server that did not answer)."""
        out = []
        for sample in self.samples:
            value = getattr(sample.metrics, key)
            if value is not None:
                out.append(value)
        return out


@dataclass(frozen=True)
class Snapshot:
    """What one poll brought back: the fleet (or why it is missing) and the active screen's extra data."""

    fleet: Fleet | None
    error: str | None
    polled_at: float
    extra: Any = None
    extra_error: str | None = None
    # True when the fleet's error is that nothing answered; False when an answer came but was unusable
    unreachable: bool = False
