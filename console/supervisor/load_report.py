"""What the built-in load generator reports, in the supervisor's status API (`/fleet` key "load").

One typed form shared by the generator (which fills it), `tokenspeed status` and the console (which
read it back from JSON), so the line an operator reads is the same wherever it is shown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoadReport:
    rate_per_s: float  # the profile's target arrival rate over the whole fleet
    sent: int
    ok: int
    errors: int
    skipped: int  # arrivals dropped because `concurrency` requests were in flight
    sent_per_s: float  # requests sent per second over the last minute (or since start)
    last_error: str | None = None
    last_error_at: float | None = None  # Unix seconds

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> LoadReport | None:
        """The report in a /fleet answer, or None when the fleet has no [load] (or the data is not one)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                rate_per_s=float(data["rate_per_s"]),
                sent=int(data["sent"]),
                ok=int(data["ok"]),
                errors=int(data["errors"]),
                skipped=int(data.get("skipped") or 0),
                sent_per_s=float(data.get("sent_per_s") or 0.0),
                last_error=data.get("last_error") or None,
                last_error_at=data.get("last_error_at"),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        """`load: 0.5 req/s target, sent 12, ok 11, errors 1 (last error: ...)`."""
        line = f"load: {self.rate_per_s:g} req/s target, sent {self.sent}, ok {self.ok}, errors {self.errors}"
        if self.skipped:
            line += f", skipped {self.skipped} (concurrency full)"
        if self.last_error:
            line += f" (last error: {self.last_error})"
        return line
