"""When to restart a server that ended, and how long to wait first.

Backoff doubles (by `multiplier`) from `initial_s` up to `max_s`, and starts over once a server has run
healthily for `reset_after_s`. A server that needs more than `max_restarts` restarts inside
`restart_window_s` is in a crash loop and goes FATAL; only that server is affected.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from console.profile.schema import BackoffSpec
from console.supervisor.states import ExitInfo


@dataclass
class RestartPolicy:
    policy: str  # always | on-failure | no
    backoff: BackoffSpec
    max_restarts: int
    window_s: float
    _recent: deque = field(default_factory=deque)
    _streak: int = 0  # restarts since the server was last healthy for reset_after_s

    def wants_restart(self, exit_info: ExitInfo) -> bool:
        if self.policy == "always":
            return True
        if self.policy == "on-failure":
            return exit_info.failed
        return False

    def crash_looping(self, now: float) -> bool:
        """True when one more restart would exceed `max_restarts` within the window."""
        while self._recent and now - self._recent[0] > self.window_s:
            self._recent.popleft()
        return len(self._recent) >= self.max_restarts

    def recent_restarts(self, now: float) -> int:
        """Restarts inside the window (a crash loop shows as several)."""
        return sum(1 for t in self._recent if now - t <= self.window_s)

    def next_delay(self, now: float) -> float:
        """Record a restart at `now` and return how long to wait before it."""
        delay = min(self.backoff.initial_s * self.backoff.multiplier**self._streak, self.backoff.max_s)
        self._streak += 1
        self._recent.append(now)
        return delay

    def note_healthy_since(self, since: float, now: float) -> None:
        if now - since >= self.backoff.reset_after_s:
            self._streak = 0

    def reset(self) -> None:
        """An operator's explicit start or restart clears the crash-loop history."""
        self._recent.clear()
        self._streak = 0
