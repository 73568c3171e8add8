"""A server's metrics history over a sliding window, brought up to date by fetching only what is new.

The Server screen plots the last five minutes of samples. Fetching all 300 of them on every poll (and
parsing them again) was most of what the screen's poll cost; the samples already held do not change, so
after the first fetch only those newer than the last one are asked for, and those older than the window
are dropped. A replay moves through time, so it always fetches the whole window.
"""

from __future__ import annotations

import bisect

from console.tui.model import History
from console.tui.source import DataSource

# Asked for a little before the newest sample held: a sample scraped just before it is still returned,
# then dropped as already held.
OVERLAP_S = 2.0


def updated_history(
    source: DataSource, server: str, seconds: float, held: History | None, now: float
) -> History:
    """`server`'s samples of the last `seconds` before `now`: `held` (the same server's, fetched earlier
    from this live source) completed with the newer ones, or the whole window when nothing usable is held."""
    if held is None or not held.samples or now - held.samples[-1].t >= seconds:
        return source.history(server, seconds)
    last = held.samples[-1].t
    fresh = source.history(server, now - last + OVERLAP_S).samples
    start = bisect.bisect_left(fresh, last, key=lambda s: s.t)
    newer = tuple(s for s in fresh[start:] if s.t > last)
    keep = bisect.bisect_left(held.samples, now - seconds, key=lambda s: s.t)
    return History(samples=held.samples[keep:] + newer)
