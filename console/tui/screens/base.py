"""What every console screen shares: header and footer, screen switching, and the poll contract.

A screen says what it needs beyond the fleet (`poll_request`, run in the poll worker thread) and
draws a finished `Snapshot` (`show`, on the UI thread). The app only hands snapshots to the visible
screen, so hidden screens never redraw.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, cast

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static

from console.tui.console_host import ConsoleHost
from console.tui.model import Snapshot
from console.tui.source import DataSource
from console.tui.widgets.key_hints import KeyHints

PollRequest = Callable[[DataSource], Any]

# Python starts a young-generation collection every 700 new objects: dozens in one poll of the console, each
# walking every object still young. At 10,000 most of a poll's short-lived objects are already freed (by
# reference counting) when one comes: on the Server screen the collector's time a poll halves (0.8 to 0.4 ms).
YOUNG_COLLECTION_AFTER = 10_000


class ConsoleScreen(Screen):
    """Base of the six console screens (one per app mode)."""

    #: Mode name (also the number-key order in `app.SCREEN_ORDER`).
    MODE = ""
    #: True when the screen shows one server (the fleet table's cursor row).
    NEEDS_SERVER = False
    _status_line: str | None = None  # what the status line shows now
    _heap_settled = False  # this screen's widgets were built and drawn, then frozen out of the collector
    _collector_before: tuple[int, int, int] | None = None  # the thresholds this screen raised, to restore

    BINDINGS = [
        Binding("tab", "app.next_screen(1)", "Next screen", show=False),
        Binding("shift+tab", "app.next_screen(-1)", "Prev screen", show=False),
    ]

    @property
    def console(self) -> ConsoleHost:
        return cast(ConsoleHost, self.app)

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
            self.call_after_refresh(self._settle_heap)

    def _settle_heap(self) -> None:
        """Move what exists now (modules, styles, this screen's widgets) out of the garbage collector's sight,
        once the screen's first poll is drawn, and let young objects pile up longer before a collection.

        Every few dozen polls the short-lived objects of the polls trigger a full collection, which walked
        all of the console's long-lived objects: 50-90 ms each time, 2-3 ms a poll on average. Frozen
        objects are still freed when nothing refers to them; only a cycle among them would never be
        collected, so the young generations are collected first (frozen garbage cannot be reclaimed).
        """
        gc.collect(1)
        gc.freeze()
        young, *older = gc.get_threshold()
        if young < YOUNG_COLLECTION_AFTER:
            self._collector_before = (young, *older)
            gc.set_threshold(YOUNG_COLLECTION_AFTER, *older)

    def on_unmount(self) -> None:
        # The app is closing: hand what `_settle_heap` froze back to the collector, with its thresholds, so
        # that a process that runs consoles one after another (a test run) frees each one's widget cycles.
        gc.unfreeze()
        if self._collector_before is not None:
            gc.set_threshold(*self._collector_before)

    def on_screen_resume(self) -> None:
        # A screen that just became visible should not wait a whole interval for its data.
        self.console.poll_now()
        if self.console.snapshot is not None:
            self.console.refresh_status()
