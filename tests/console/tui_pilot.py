"""Pilot helpers for the console tests: read what a screen shows, wait for it to change."""

from __future__ import annotations

import io
import time

from rich.console import Console
from rich.text import Text
from textual.widgets import RichLog, Static

from console.tui.app import ConsoleApp


def plain(widget: Static) -> str:
    """The text a Static shows, whatever it was given (str, Text or a Rich renderable)."""
    content = widget.content
    if isinstance(content, Text):
        return content.plain
    if isinstance(content, str):
        return content
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(content)
    return console.export_text()


def text_of(app: ConsoleApp, selector: str) -> str:
    return plain(app.screen.query_one(selector, Static))


def status(app: ConsoleApp) -> str:
    return text_of(app, "#status")


# What Textual draws at the ends of a scrollbar thumb (and the history plots draw on purpose).
EIGHTH_BLOCKS = frozenset("▁▂▃▄▅▆▇▉▊▋▌▍▎▏")


def screen_lines(app: ConsoleApp) -> list[str]:
    """The terminal's lines as the screen draws them now (the whole screen, every widget composed)."""
    console = Console(width=app.size.width, file=io.StringIO(), record=True, color_system=None)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text().splitlines()


def log_lines(app: ConsoleApp) -> list[str]:
    return [strip.text for strip in app.screen.query_one(RichLog).lines]


# The fleet table's first columns, in the order these tests index them (the screen's own order and the
# columns it shows depend on the terminal's width: `row_cells` names them).
_INDEXED = (
    "name",
    "node",
    "gpus",
    "state",
    "uptime",
    "restarts",
    "queue",
    "kv",
    "hit",
    "tps",
    "ttft",
    "errors",
)


def row_cells(app: ConsoleApp) -> dict[str, dict[str, str]]:
    """Fleet table rows by server name: the plain text shown in each column, by column key."""
    keys = [c.key for c in app.screen.shown]
    return {
        name: dict(zip(keys, (c.plain for c in cells), strict=True))
        for name, cells in app.screen.cells.items()
    }


def table_rows(app: ConsoleApp) -> dict[str, list[str]]:
    """Fleet table rows by server name, the cells in `_INDEXED` order ("" for a column not shown)."""
    return {name: [cells.get(k, "") for k in _INDEXED] for name, cells in row_cells(app).items()}


def row_order(app: ConsoleApp) -> list[str]:
    return list(app.screen.query_one("#fleet-table").names)


async def wait_for(pilot, condition, timeout: float = 30.0, what: str = "condition"):
    """Let the app run until `condition()` is truthy; its last value is returned."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # a widget not mounted yet: try again
            last_error = exc
        await pilot.pause(0.1)
    raise AssertionError(
        f"timed out waiting for {what}" + (f" (last error: {last_error!r})" if last_error else "")
    )


async def wait_for_rows(pilot, app: ConsoleApp, count: int) -> None:
    """Let the app run until the fleet table lists `count` servers."""
    await wait_for(pilot, lambda: len(table_rows(app)) == count, what=f"{count} fleet rows")
