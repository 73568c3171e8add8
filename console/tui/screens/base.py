"""What every console screen shares: header and footer, screen switching, and the poll contract.

A screen says what it needs beyond the fleet (`poll_request`, run in the poll worker thread) and
draws a finished `Snapshot` (`show`, on the UI thread). The app only hands snapshots to the visible
screen, so hidden screens never redraw.
"""

from __future__ import annotations

import gc
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
    _heap_settled = False  # this screen's widgets were built and drawn, then frozen out of the collector

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
        if not self._heap_settled:
            self._heap_settled = True
            self.call_after_refresh(settle_heap)

    def on_unmount(self) -> None:
        # The app is closing: hand what `settle_heap` froze back to the collector, so that a process that
        # runs consoles one after another (a test run) frees each one's widget cycles.
        gc.unfreeze()

    def on_screen_resume(self) -> None:
        # A screen that just became visible should not wait a whole interval for its data.
        self.console.poll_now()
        if self.console.snapshot is not None:
            self.console.refresh_status()


def settle_heap() -> None:
    """Move what exists now (modules, styles, this screen's widgets) out of the garbage collector's sight.

    Called once per screen, after its first poll is drawn. Every poll makes short-lived objects, and
    every few dozen polls they trigger a full collection, which walked all of the console's long-lived
    objects: 50-90 ms each time, 2-3 ms a poll on average. Frozen objects are still freed when nothing
    refers to them; only a cycle among them would never be collected, so a collection of the young
    generations runs first (frozen garbage cannot be reclaimed later).
    """
    gc.collect(1)
    gc.freeze()

