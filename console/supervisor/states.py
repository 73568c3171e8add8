"""The life of one supervised server, and what is recorded when its process ends.

STARTING ──health ok──► READY ◄──health ok── UNHEALTHY
   │                      │  └─health fails─────┘
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


@dataclass(frozen=True)
class ExitInfo:
    """How a server's process ended: an exit code, or the signal that killed it (None: not known)."""

    code: int | None
    signal: str | None
    at: float

    @classmethod
    def from_returncode(cls, returncode: int | None, at: float) -> ExitInfo:
        if returncode is None:
            return cls(None, None, at)
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = str(-returncode)
            return cls(None, name, at)
        return cls(returncode, None, at)

    @property
    def failed(self) -> bool:
        """Anything but a clean exit 0 counts as a failure for `restart = "on-failure"`."""
        return self.code != 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ExitInfo | None:
        return None if data is None else cls(data.get("code"), data.get("signal"), data.get("at", 0.0))
