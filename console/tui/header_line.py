"""The console's header line: the fleet's troubles counted in words, the poll or replay clock, the modes
in force and, when the last poll failed, what failed."""

from __future__ import annotations

import time

from rich.markup import escape

from console.tui.model import Fleet, Snapshot


def problem_counts(fleet: Fleet) -> str:
    """ "2 ready  1 crash-looping  1 stalled": every kind of trouble counted in the header, in words."""
    servers = fleet.servers
    failing = sum(
        1 for s in servers if s.state in ("UNHEALTHY", "FATAL") or (s.state == "READY" and s.health == "bad")
    )
    counts = [
        ("green", "ready", sum(1 for s in servers if s.state == "READY" and s.health == "ok")),
        ("bold red", "crash-looping", sum(1 for s in servers if s.crash_looping)),
        ("yellow", "restarting", sum(1 for s in servers if s.state == "BACKOFF" and not s.crash_looping)),
        ("bold red", "stalled", sum(1 for s in servers if s.state == "STALLED")),
        ("red", "failing", failing),
        ("yellow", "draining", sum(1 for s in servers if s.state == "STOPPING")),
    ]
    return "  ".join(f"[{style}]{n} {word}[/]" for style, word, n in counts if n or word == "ready")


def header_line(
    snap: Snapshot | None,
    *,
    replay_at: float | None,
    paused: bool,
    interval: float,
    readonly: bool,
    marked: int,
) -> str:
    parts: list[str] = []
    if snap is not None and snap.fleet is not None:
        fleet = snap.fleet
        parts.append(f"[b]{fleet.name}[/b]  {len(fleet.servers)} servers  " + problem_counts(fleet))
    if replay_at is not None:
        parts.append(f"[magenta]REPLAY at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(replay_at))}[/]")
    parts.append("[yellow]PAUSED[/]" if paused else f"every {interval:g}s")
    if snap is not None and replay_at is None:
        parts.append(f"polled {time.strftime('%H:%M:%S', time.localtime(snap.polled_at))}")
    if readonly:
        parts.append("[cyan]read-only[/]")
    if marked:
        parts.append(f"{marked} marked")
    if snap is not None and snap.error:
        # "unreachable" only when nothing answered: an answer the console cannot use says so instead
        if snap.unreachable:
            what = "supervisor unreachable"
        elif replay_at is not None:
            what = "recording unreadable"
        else:
            what = "supervisor answered, fleet unreadable"
        parts.append(f"[b red]{what}: {escape(snap.error)}[/]")
    return "  ·  ".join(parts)
