"""Short, fixed-width renderings of numbers for table cells; '-' where a value is missing."""

from __future__ import annotations

DASH = "-"


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return DASH
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"


def percent(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio * 100:.0f}%"


def count(value: float | None) -> str:
    if value is None:
        return DASH
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}"


def rate(value: float | None) -> str:
    if value is None:
        return DASH
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def latency(seconds: float | None) -> str:
    """Seconds as ms below 10 s, so TTFT and ITL columns line up."""
    if seconds is None:
        return DASH
    if seconds < 10:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s"


def pair(left: str, right: str) -> str:
    return f"{left}/{right}"


def mib(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"
