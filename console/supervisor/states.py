"""The life of one supervised server, and what is recorded when its process ends.

STARTING ──health ok──► READY ◄──health ok── UNHEALTHY
   │                      │  └─health fails─────┘   (either, STALLED for unhealthy_restart_after_s:
   │                      │                          stopped and restarted, reason "stalled")
   │ exits / start timeout│ exits
   ▼                      ▼
BACKOFF ──delay over──► STARTING            (restart policy allows)
   └── too many restarts in the window ──► FATAL
any running state ──stop──► STOPPING ──all processes gone──► STOPPED
"""

from __future__ import annotations

import enum
import signal
from dataclasses import asdict, dataclass


class State(str, enum.Enum):  # noqa: UP042 - str() keeps the Enum form the state file and logs were written with
    STARTING = "STARTING"
    READY = "READY"
    UNHEALTHY = "UNHEALTHY"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FATAL = "FATAL"

    @property
    def has_process(self) -> bool:
        return self in (State.STARTING, State.READY, State.UNHEALTHY, State.STOPPING)


# Why the supervisor ended a server itself, or what it knows of an end it did not see.
REASON_UNHEALTHY = "unhealthy"
REASON_STALLED = "stalled"  # its scheduler ran no step and sent no heartbeat (console/supervisor/scrapes.py)
REASON_UNSUPERVISED = "exited while unsupervised; status unknown"
REASON_ADOPTED = "exit status unknown (started by an earlier supervisor, so not this one's child)"


@dataclass(frozen=True)
class ExitInfo:
    """How a server's process ended: an exit code, or the signal that killed it (None: not known),
    and `reason`, why, when the supervisor knows more than the code (it killed a hung server) or less
    (the process ended while no supervisor watched it)."""

    code: int | None
    signal: str | None
    at: float
    reason: str | None = None

    @classmethod
    def from_returncode(cls, returncode: int | None, at: float, reason: str | None = None) -> ExitInfo:
        if returncode is None:
            return cls(None, None, at, reason)
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = str(-returncode)
            return cls(None, name, at, reason)
        return cls(returncode, None, at, reason)

    @property
    def failed(self) -> bool:
        """Anything but a clean exit 0 counts as a failure for `restart = "on-failure"`; so does the
        clean exit of a hung or stalled server the supervisor stopped."""
        return self.code != 0 or self.reason in (REASON_UNHEALTHY, REASON_STALLED)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ExitInfo | None:
        if data is None:
            return None
        return cls(data.get("code"), data.get("signal"), data.get("at", 0.0), data.get("reason"))

    def describe(self) -> str:
        """`signal SIGKILL`, `exit code 3` or `exit status unknown`, then the reason when there is one."""
        if self.signal:
            how = f"signal {self.signal}"
        elif self.code is None:
            how = "exit status unknown"
        else:
            how = f"exit code {self.code}"
        if self.reason and self.code is None and self.signal is None:
            return self.reason
        return f"{how}: {self.reason}" if self.reason else how
