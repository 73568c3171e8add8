"""What the supervisor keeps of one server's scrapes: the window, the latest summary, and whether the
scheduler is making progress.

A server is *stalled* when it has requests in flight but its scheduler has run no step
(`tokenspeed:scheduler_steps_total` stands still) for `stall_after_s`, or when a scheduler rank has not
reported to its front end for that long (`tokenspeed:scheduler_heartbeat_age_seconds`; a running rank
reports every second even when idle): its HTTP front end still answers /metrics, so nothing else would
show it that soon. Progress is judged on the supervisor's clock, at
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
        """Seconds the scheduler has been quiet, once past `stall_after_s`; else None. Quiet is no step
        while requests wait, or (idle or not) no word from a scheduler rank to its front end, which every
        rank sends at least each second (`tokenspeed:scheduler_heartbeat_age_seconds`)."""
        if stall_after_s <= 0 or self.summary is None:
            return None
        quiet: list[float] = []
        busy = (self.summary.get("in_flight") or 0) > 0
        if self.progress_at is not None and self.summary.get("steps_total") is not None and busy:
            quiet.append(now - self.progress_at)
        age = self.summary.get("heartbeat_age")
        if age is not None and self.scraped_at is not None:
            quiet.append(age + max(now - self.scraped_at, 0.0))
        longest = max(quiet, default=0.0)
        return longest if longest >= stall_after_s else None
