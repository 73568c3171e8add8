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

from dataclasses import dataclass
from pathlib import Path

from console.profile.toml import ProfileError, did_you_mean, not_a_table, read_profile
from console.ranges import bounded, read_numbers


@dataclass(frozen=True)
class Thresholds:
    kv_usage: float = bounded(0.9, 0.0, 1.0)
    ttft_p99_s: float = bounded(2.0, 0.0)
    queue_p99_s: float = bounded(1.0, 0.0)
    errors: float = bounded(1.0, 0.0)
    preemptions: float = bounded(1.0, 0.0)
    balancedness: float = bounded(0.8, 0.0, 1.0)


def parse_thresholds(raw) -> Thresholds:
    """The `[console.thresholds]` table of a raw profile (`console.profile.toml.RawProfile`), checked."""
    console = raw.data.get("console", {})
    if not isinstance(console, dict):
        raise raw.error("", "console", not_a_table("console", console))
    for key in console:
        if key != "thresholds":
            raise raw.error("console", key, f"is not a [console] key{did_you_mean(key, ['thresholds'])}")
    table = console.get("thresholds", {})
    if not isinstance(table, dict):
        raise raw.error("console", "thresholds", not_a_table("console.thresholds", table))
    return read_numbers(raw, "console.thresholds", Thresholds, table)


def thresholds_of(profile_path: str | Path | None) -> Thresholds:
    """The thresholds a fleet's profile sets; the defaults when it sets none or cannot be read now."""
    if not profile_path:
        return Thresholds()
    try:
        return parse_thresholds(read_profile(profile_path))
    except (ProfileError, OSError, ValueError):
        return Thresholds()
