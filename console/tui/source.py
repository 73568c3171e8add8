"""The console's data-source seam: screens ask a `DataSource`, never the supervisor or SQLite directly.

Two implementations: `LiveSource` (a running supervisor's control API) and `ReplaySource` (the
supervisor's recorded SQLite history). Every method runs in a worker thread and may block; every
failure surfaces as `SourceError` with a message an operator can read, never another exception type,
so one dead supervisor or server can only ever produce a red line on screen.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from console.client import SERVER_ROUTES
from console.tui.model import Fleet, History

# Server actions the console offers, keyed by the name the key bindings and command palette use.
SERVER_ACTIONS = tuple(SERVER_ROUTES)
FLEET_ACTIONS = ("rolling_restart",)


class SourceError(Exception):
    """A data source could not answer (supervisor down, server gone, bad recording)."""


class SourceUnreachable(SourceError):
    """Nothing answered at all (no socket, refused, timed out), as against an answer that was unusable."""


class DataSource(ABC):
    """Where the console's data comes from. Methods block; call them from worker threads only."""

    #: True when actions are impossible whatever the user asked (a replay).
    readonly: bool = False

    @property
    @abstractmethod
    def label(self) -> str:
        """One line for the header: what this console is looking at."""

    @abstractmethod
    def fleet(self) -> Fleet: ...

    @abstractmethod
    def history(self, server: str, seconds: float) -> History: ...

    @abstractmethod
    def raw_metrics(self, server: str) -> str: ...

    @abstractmethod
    def info(self, server: str) -> dict[str, Any]: ...

    @abstractmethod
    def logs(self, server: str, lines: int) -> list[str]: ...

    @abstractmethod
    def probe(self) -> dict[str, Any]: ...

    def events(self, seconds: float) -> list[dict[str, Any]]:
        """What happened to the servers over the last `seconds` (oldest first): {"server", "t", "kind",
        "text"}; none from a source that does not record them."""
        return []

    def expert_placement(self, server: str) -> dict[str, Any]:
        """The server's GET /expert_placement: which EP rank holds which expert, the last rebalance."""
        raise SourceError(f"expert placement of {server}: not recorded (a replay keeps metrics, not placements)")

    def action(self, name: str, server: str | None = None) -> Any:
        """Run one server action (`SERVER_ACTIONS`) or fleet action (`FLEET_ACTIONS`)."""
        raise SourceError(f"{name}: this source is read-only")

    def shutdown(self) -> None:
        """Stop the whole fleet (used when leaving a console that started it)."""
        raise SourceError("shutdown: this source is read-only")

    def close(self) -> None:
        """Release connections; the fleet itself keeps running."""
        return None

    # Replay sources move through time; live ones ignore this.
    def seek(self, delta_s: float) -> None:
        return None

    @property
    def now(self) -> float | None:
        """The time the data is shown at, or None for live data."""
        return None
