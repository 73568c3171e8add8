"""The fleet table's columns: what each shows, how it sorts, how urgent it is, and when it is drawn red.

Each column has a sort key (`shift+letter` on the fleet screen sorts by it; again reverses) and a priority:
on a narrow terminal the lowest-priority columns are left out first, so at 80 columns the operator still
sees state, queue, KV, throughput, TTFT and errors. Values older than two polls are dimmed and the
server's row says how old they are: a value is never shown as current when it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from console.profile.thresholds import Thresholds
from console.tui import fmt
from console.tui.model import Server
from console.tui.widgets.server_table import Cell

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "bad": "bold red", "off": "dim"}
# How bad a state is, for the "problems first" order (lower sorts first).
_STATE_RANK = {"FATAL": 0, "STALLED": 1, "UNHEALTHY": 1, "BACKOFF": 2, "STARTING": 3, "STOPPING": 4}


def m(server: Server, key: str) -> float | None:
    return getattr(server.metrics, key) if server.metrics is not None else None


def _num(value: float | None) -> float:
    return float("-inf") if value is None else value


def state_text(server: Server) -> str:
    """The state, and what it means now: how long stalled, how many requests a drain waits for, restarts."""
    if server.state == "STALLED" and server.stalled_s is not None:
        return f"STALLED {server.stalled_s:.0f}s"
    if server.state == "STOPPING" and server.draining is not None:
        left = server.draining.get("in_flight")
        return "DRAINING" + (f" {left:.0f}" if isinstance(left, (int, float)) else "")
    if server.state in ("BACKOFF", "STARTING") and server.recent_restarts >= 2:
        return f"{server.state} x{server.recent_restarts}"
    return server.state + ("!" if server.error else "")


def problem_rank(server: Server) -> tuple:
    """Problems first: broken states, then servers with errors, then KV pressure; within each, by node and
    name, so rows do not move while nothing changes."""
    rank = _STATE_RANK.get(server.state, 5 if server.state == "READY" else 6)
    errors = (m(server, "errors") or 0) > 0
    pressed = (m(server, "kv_usage") or 0) >= Thresholds().kv_usage
    return (rank, not errors, not pressed, server.node, server.name)


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    # shift+letter sorts by this column ("": none); never R, S, F, X, B or O, which are actions
    sort_letter: str
    priority: int  # 0 is always shown; higher is left out first on a narrow terminal
    cell: Callable[[Server], str]
    sort: Callable[[Server], object]
    is_metric: bool = False  # dimmed when stale
    # -> style of the cell when its value crosses a threshold ("" when fine)
    alarm: Callable[[Server, Thresholds], str] | None = None


def _over(value: float | None, limit: float | None) -> bool:
    return value is not None and limit is not None and value >= limit


def _or_inf(value: float | None) -> float:
    return float("inf") if value is None else value


def _under(value: float | None, limit: float | None) -> bool:
    return value is not None and limit is not None and value < limit


def _metric(
    key: str,
    label: str,
    letter: str,
    priority: int,
    name: str,
    show: Callable[[float | None], str],
    over: Callable[[Thresholds], float | None] | None = None,
    cell: Callable[[Server], str] | None = None,
) -> Column:
    """A column of the server metric `name`: drawn by `show` (or `cell`), sorted by the metric, and bold red
    once it reaches the threshold `over` picks from the Thresholds."""

    def alarm(server: Server, thresholds: Thresholds) -> str:
        return "bold red" if _over(m(server, name), over(thresholds)) else ""

    return Column(
        key,
        label,
        letter,
        priority,
        cell or (lambda s: show(m(s, name))),
        lambda s: _num(m(s, name)),
        is_metric=True,
        alarm=alarm if over is not None else None,
    )


def columns(window: str) -> tuple[Column, ...]:
    """The columns, their labels naming the window their rates and percentiles cover (e.g. "30s")."""
    return (
        Column("name", "NAME", "N", 0, lambda s: s.name, lambda s: s.name),
        Column("state", "STATE", "P", 0, state_text, problem_rank),
        Column("node", "NODE", "D", 6, lambda s: s.node, lambda s: (s.node, s.name)),
        Column("gpus", "GPUS", "G", 7, lambda s: ",".join(map(str, s.gpus)) or "cpu", lambda s: s.gpus),
        Column("uptime", "UPTIME", "U", 5, lambda s: fmt.duration(s.uptime_s), lambda s: _num(s.uptime_s)),
        Column(
            "restarts",
            "RESTARTS",
            "C",
            3,
            lambda s: str(s.restarts),
            lambda s: s.restarts,
            alarm=lambda s, t: "yellow" if s.restarts else "",
        ),  # fmt: skip
        Column(
            "queue",
            "RUN/WAIT",
            "W",
            1,
            lambda s: fmt.pair(fmt.count(m(s, "running")), fmt.count(m(s, "waiting"))),
            lambda s: (_num(m(s, "waiting")), _num(m(s, "running"))),
            is_metric=True,
        ),
        _metric("kv", "KV", "K", 1, "kv_usage", fmt.percent, over=lambda t: t.kv_usage),
        _metric("preempt", f"PREEMPT {window}", "M", 2, "preemptions", fmt.count, over=lambda t: t.preemptions),
        _metric("hit", "PREFIX HIT", "H", 4, "prefix_hit_rate", fmt.percent),
        _metric("tps", "TOK/S", "T", 1, "gen_throughput", fmt.rate),
        _metric(
            "ttft", f"TTFT p50/p99 {window}", "L", 1, "ttft_p99", fmt.latency, over=lambda t: t.ttft_p99_s,
            cell=lambda s: fmt.pair(fmt.latency(m(s, "ttft_p50")), fmt.latency(m(s, "ttft_p99"))),
        ),  # fmt: skip
        _metric("qtime", f"QUEUE p99 {window}", "Q", 2, "queue_p99", fmt.latency, over=lambda t: t.queue_p99_s),
        _metric("errors", f"ERRORS {window}", "E", 1, "errors", fmt.count, over=lambda t: t.errors),
        Column(
            "bal",
            "BALANCE",
            "",  # no letter of its own: `o` reaches it (drawn only for MoE servers)
            5,
            lambda s: "" if m(s, "balancedness") is None else f"{m(s, 'balancedness'):.2f}",
            lambda s: _or_inf(m(s, "balancedness")),  # the least balanced first
            is_metric=True,
            alarm=lambda s, t: "bold red" if _under(m(s, "balancedness"), t.balancedness) else "",
        ),
        Column("age", "AGE", "A", 0, lambda s: "", lambda s: _num(s.scraped_at)),
    )

# Columns drawn only when some row has a value: AGE (only stale rows have one) and BALANCE (MoE servers).
SHOWN_WHEN_SET = ("age", "bal")


def stale_age(server: Server, now: float, fresh_s: float) -> float | None:
    """How old the server's values are, when older than `fresh_s` (two polls); None when fresh or absent."""
    if server.metrics is None or server.scraped_at is None:
        return None
    age = now - server.scraped_at
    return age if age > fresh_s else None


def row_cells(server: Server, cols: tuple[Column, ...], thresholds: Thresholds, age: float | None,
              marked: bool) -> tuple[Cell, ...]:  # fmt: skip
    health = HEALTH_STYLE.get(server.health, "")
    cells = []
    for column in cols:
        text = column.cell(server)
        style = health if column.key in ("name", "state") else ""
        if column.alarm is not None and text != fmt.DASH:
            style = column.alarm(server, thresholds) or style
        if column.is_metric and age is not None:
            style = "dim"  # an old value is never drawn like a current one, alarm colours included
        if column.key == "age" and age is not None:
            text, style = f"{fmt.duration(age)} old", "dim yellow"
        if column.key == "name" and marked:
            text, style = "● " + text, style + " reverse"
        cells.append(Cell(text, style))
    return tuple(cells)
