"""What the supervisor keeps of one server's scrapes: the window, the latest summary, and whether the
scheduler is making progress.

A server is *stalled* when it has requests in flight but its scheduler has run no step
(`tokenspeed:scheduler_steps_total` stands still) for `stall_after_s`: its HTTP front end still answers
/health and /metrics, so nothing else would show it. Progress is judged on the supervisor's clock, at
each scrape: the step count changed, or there was nothing to do.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from console import metrics_math

# Percentiles, rates and error counts cover the last half minute of scrapes: the one window every screen
# labels ("p99 30s").
WINDOW_S = 30.0


@dataclass
class ServerScrapes:
    interval_s: float
    window: collections.deque = field(default_factory=collections.deque)
    summary: dict | None = None
    scraped_at: float | None = None
    raw: str = ""
    # The last scrape at which the scheduler had made progress (a step, or nothing to do).
    progress_at: float | None = None
    stall_noted: bool = False  # the last stall event said "stalled"
    rebalances: float | None = None  # EPLB rebalances the server reported so far
    _steps: float | None = None

    def __post_init__(self) -> None:
        self.window = collections.deque(maxlen=int(WINDOW_S / self.interval_s) + 2)

    def add(self, text: str, now: float) -> dict:
        """Record one /metrics page (ValueError if it does not parse); returns its summary."""
        scrape = metrics_math.parse(text, now)
        self.window.append(scrape)
        oldest = next((s for s in self.window if now - s.t <= WINDOW_S and s is not scrape), None)
        summary = metrics_math.summarize(scrape, oldest)
        steps, busy = summary.get("steps_total"), (summary.get("in_flight") or 0) > 0
        if steps is None or not busy or steps != self._steps or self.progress_at is None:
            self.progress_at = now
        self._steps = steps
        self.raw, self.summary, self.scraped_at = text, summary, now
        self.rebalances = scrape.get("eplb_rebalances_total")
        return summary

    def stalled_for(self, now: float, stall_after_s: float) -> float | None:
        """Seconds without a scheduler step while requests wait, once past `stall_after_s`; else None."""
        if stall_after_s <= 0 or self.progress_at is None or self.summary is None:
            return None
        if self.summary.get("steps_total") is None or not (self.summary.get("in_flight") or 0) > 0:
            return None
        quiet = now - self.progress_at
        return quiet if quiet >= stall_after_s else None
