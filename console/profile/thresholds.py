"""`[console.thresholds]`: when the console draws a value red. Every key is optional.

[console.thresholds]
kv_usage = 0.9          # KV cache use (0..1) at or above this
ttft_p99_s = 2.0        # TTFT p99 over the window, seconds: the latency SLO
queue_p99_s = 1.0       # queue time p99 over the window, seconds
errors = 1              # HTTP 4xx/5xx answers and aborts over the window
preemptions = 1         # preemptions over the window (KV pages ran out)
balancedness = 0.8      # EPLB balancedness (mean/max per EP rank) below this
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Thresholds:
    kv_usage: float = 0.9
    ttft_p99_s: float = 2.0
    queue_p99_s: float = 1.0
    errors: float = 1.0
    preemptions: float = 1.0
    balancedness: float = 0.8


_LIMITS = {"kv_usage": (0.0, 1.0), "balancedness": (0.0, 1.0)}


def parse_thresholds(raw) -> Thresholds:
    """The `[console.thresholds]` table of a raw profile (`console.profile.toml.RawProfile`), checked."""
    from console.profile.toml import did_you_mean, not_a_table

    console = raw.data.get("console", {})
    if not isinstance(console, dict):
        raise raw.error("", "console", not_a_table("console", console))
    for key in console:
        if key != "thresholds":
            raise raw.error("console", key, f"is not a [console] key{did_you_mean(key, ['thresholds'])}")
    table = console.get("thresholds", {})
    if not isinstance(table, dict):
        raise raw.error("console", "thresholds", not_a_table("console.thresholds", table))
    fields = {f.name for f in dataclasses.fields(Thresholds)}
    values = {}
    for key, value in table.items():
        if key not in fields:
            raise raw.error("console.thresholds", key, f"is not a threshold{did_you_mean(key, fields)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise raw.error("console.thresholds", key, f"expects a number >= 0, got {value!r}")
        low, high = _LIMITS.get(key, (0.0, float("inf")))
        if not low <= value <= high:
            raise raw.error("console.thresholds", key, f"must be between {low:g} and {high:g}, got {value!r}")
        values[key] = float(value)
    return Thresholds(**values)


def thresholds_of(profile_path: str | Path | None) -> Thresholds:
    """The thresholds a fleet's profile sets; the defaults when it sets none or cannot be read now."""
    if not profile_path:
        return Thresholds()
    from console.profile.toml import ProfileError, read_profile

    try:
        return parse_thresholds(read_profile(profile_path))
    except (ProfileError, OSError, ValueError):
        return Thresholds()
