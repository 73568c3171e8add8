"""What every console screen shares: header and footer, screen switching, and the poll contract.

A screen says what it needs beyond the fleet (`poll_request`, run in the poll worker thread) and
draws a finished `Snapshot` (`show`, on the UI thread). The app only hands snapshots to the visible
screen, so hidden screens never redraw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static

from console.tui.model import Snapshot
from console.tui.source import DataSource
from console.tui.widgets.key_hints import KeyHints

if TYPE_CHECKING:
    from console.tui.app import ConsoleApp

PollRequest = Callable[[DataSource], Any]


class ConsoleScreen(Screen):
    """Base of the six console screens (one per app mode)."""

    #: Mode name (also the number-key order in `app.SCREEN_ORDER`).
    MODE = ""
    #: True when the screen shows one server (the fleet table's cursor row).
    NEEDS_SERVER = False
    _status_line: str | None = None  # what the status line shows now

    BINDINGS = [
        Binding("tab", "app.next_screen(1)", "Next screen", show=False),
        Binding("shift+tab", "app.next_screen(-1)", "Prev screen", show=False),
    ]

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose_header(self):
        yield Header(icon="⚡")
        yield Static("", id="status", classes="status")

    def compose_footer(self):
        yield KeyHints(id="keys")

    def poll_request(self) -> PollRequest | None:
        """What to fetch for this screen on each poll, besides the fleet. Runs in a worker thread."""
        return None

    def show(self, snapshot: Snapshot) -> None:
        """Draw a finished poll. Only called while this screen is visible."""

    def show_status(self, line: str) -> None:
        # One line, always (app.tcss): no new layout of the screen for a new text.
        if line != self._status_line:
            self._status_line = line
            self.query_one("#status", Static).update(line, layout=False)

    def on_screen_resume(self) -> None:
        # A screen that just became visible should not wait a whole interval for its data.
        self.console.poll_now()
        if self.console.snapshot is not None:
            self.console.refresh_status()
