"""What a console screen may use of the app that shows it: the selection, the last poll, the poller, the
profile launcher and navigation.

The screens are written against this protocol rather than against `ConsoleApp`, so that the app (which
lists the screens as its modes) imports them and they never import it back.
"""

from __future__ import annotations

from typing import Protocol

from console.tui.model import Snapshot
from console.tui.poller import Poller
from console.tui.source import DataSource


class ConsoleHost(Protocol):
    source: DataSource
    snapshot: Snapshot | None
    #: the cursor server (the fleet table's row), shown by the one-server screens
    selected: str | None
    #: servers marked with space; actions go to them instead of the cursor server
    marked: set[str]
    readonly: bool
    state_dir: str | None
    profile_path: str | None
    poller: Poller

    def poll_now(self) -> None: ...

    def refresh_status(self) -> None: ...

    def open_server(self, name: str, mode: str = "server") -> None: ...

    def action_switch_screen_to(self, mode: str) -> None: ...

    def launch_profile_dry_run(self, path: str) -> dict | None: ...

    def launch_profile(self, path: str, dry_run: bool = True) -> str | dict: ...
