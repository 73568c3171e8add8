"""What the supervisor needs from a launcher: start one server process somewhere, watch it, signal it.

A launcher knows *where* a process runs (this machine, a Ray node); the supervisor knows *when*
(state machine, restart policy). Handles must survive the supervisor's own restart: `record()` is
saved in the state file and `adopt()` turns it back into a handle if the process still runs.
"""

from __future__ import annotations

import abc
import signal
import sys
from pathlib import Path

from console.profile.schema import ProcessSpec, ServerSpec
from console.supervisor.states import ExitInfo

DEFAULT_COMMAND = (sys.executable, "-m", "tokenspeed", "serve")


class ProcessHandle(abc.ABC):
    node_rank: int
    pid: int | None

    @abc.abstractmethod
    def poll(self) -> ExitInfo | None:
        """None while the process runs; how it ended once it has."""

    @abc.abstractmethod
    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the process and everything it started (its process group)."""

    @abc.abstractmethod
    def record(self) -> dict:
        """JSON-able identity for the state file (enough for `Launcher.adopt`)."""


class Launcher(abc.ABC):
    def __init__(self, command: tuple[str, ...] | None = None):
        self.command = tuple(command) if command else DEFAULT_COMMAND

    @abc.abstractmethod
    def start(self, server: ServerSpec, process: ProcessSpec, log_path: Path) -> ProcessHandle: ...

    @abc.abstractmethod
    def adopt(
        self, server: ServerSpec, process: ProcessSpec, record: dict, log_path: Path
    ) -> ProcessHandle | None:
        """A handle on a process a previous supervisor started, or None if it is gone."""

    def poll_logs(self) -> None:
        """Launchers whose processes log elsewhere copy new lines into the local files here."""
        return None

    def tend_log_pumps(self) -> None:
        """Launchers whose log pumps run here restart a pump that died (called every tick: cheap)."""
        return None

    def close(self) -> None:
        """Release launcher resources (not the servers: stopping them is the supervisor's job)."""
        return None
