"""Whether the scheduler ranks are alive as the front end sees them: a rank that says nothing is hung.

Every scheduler (rank 0 of each DP group) sends a stats snapshot at least every `HEARTBEAT_S`, idle or
busy (event_loop.py): after each step while it has work, from its idle poll otherwise. A rank the front end
has not heard from for `TOKENSPEED_SCHEDULER_TIMEOUT` seconds (default 30; 0 turns the check off) is
hung: stopped (SIGSTOP), deadlocked in a collective, or stuck in one step. Its process is still alive, so
the child watchdog (which waits for exits) never fires; without this the HTTP server would answer /health
200 while every request hangs.

While a rank is silent the server is *stalled*: /health answers 503, new requests 503, and the requests in
flight end with an error (503 `scheduler_stalled`) instead of waiting for ever. A rank that speaks again
clears it. The front end judges only on a tick that ran on time: after its own event loop was blocked, the
messages waiting in its socket are read before anyone is called silent.
Silence during the server's warm-up (before READY) is not judged: a first step may compile kernels for
minutes on a fresh machine, and the supervisor's start-up deadline bounds that phase.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TIMEOUT_ENV = "TOKENSPEED_SCHEDULER_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
# How often an idle scheduler says it is alive (a stats snapshot even when nothing changed).
HEARTBEAT_S = 1.0
# How often the front end looks; a tick this much later than asked means its own loop was blocked.
CHECK_S = 0.5
_LATE_S = 1.0


def scheduler_timeout() -> float:
    """`TOKENSPEED_SCHEDULER_TIMEOUT` in seconds (0: never judge a rank hung); ValueError names the fix."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds (0 turns the check off), got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{TIMEOUT_ENV} must be >= 0 seconds (0 turns the check off), got {raw!r}")
    return value


@dataclass
class SchedulerLiveness:
    """When each DP rank was last heard from (monotonic seconds), and the stall that silence makes."""

    timeout_s: float
    last_heard: dict[int, float] = field(default_factory=dict)
    stalled: str | None = None  # why the server is stalled, as clients and /health are told; None: it is not
    # The server's warm-up requests are running: a first step may compile kernels for minutes (FlashInfer's
    # families on a fresh GPU machine), no client waits yet, and the supervisor's start-up deadline bounds it.
    warming: bool = False
    _last_check: float | None = None

    @contextmanager
    def warming_up(self) -> Iterator[None]:
        """Silence is not judged while the block runs (the warm-up before READY)."""
        self.warming = True
        try:
            yield
        finally:
            self.warming = False

    def start(self, ranks: int, now: float | None = None) -> None:
        """The ranks are ready: each is counted as heard from now."""
        now = time.monotonic() if now is None else now
        self.last_heard = dict.fromkeys(range(ranks), now)

    def heard(self, dp_rank: int, now: float | None = None) -> None:
        self.last_heard[dp_rank] = time.monotonic() if now is None else now

    def ages(self, now: float | None = None) -> dict[int, float]:
        """Seconds since each rank was last heard from (what /metrics exports)."""
        now = time.monotonic() if now is None else now
        return {rank: max(now - t, 0.0) for rank, t in self.last_heard.items()}

    def check(self, now: float | None = None) -> tuple[str | None, bool]:
        """Judge the ranks now; returns (the stall reason or None, whether that changed on this call)."""
        now = time.monotonic() if now is None else now
        late = self._last_check is not None and now - self._last_check > CHECK_S + _LATE_S
        self._last_check = now
        if late or self.warming or self.timeout_s <= 0 or not self.last_heard:
            return self.stalled, False
        silent = {rank: age for rank, age in self.ages(now).items() if age >= self.timeout_s}
        before = self.stalled
        if silent:
            ranks = ", ".join(f"dp{rank} for {age:.0f}s" for rank, age in sorted(silent.items()))
            self.stalled = (
                f"the scheduler has not responded ({ranks}; {TIMEOUT_ENV}={self.timeout_s:g}); "
                "the server is stalled: retry on another server"
            )
        else:
            self.stalled = None
        return self.stalled, (before is None) != (self.stalled is None)
