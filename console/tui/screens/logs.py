"""Logs screen: the tail of the cursor server's log, with follow, search, a minimum level and line wrapping."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Input, RichLog

from console.tui.model import Snapshot
from console.tui.screens.base import ConsoleScreen
from console.tui.widgets.panel import TextPanel

TAIL_LINES = 500
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_LEVEL_RE = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|Traceback)\b")
_LEVEL_RANK = {"DEBUG": 0, "INFO": 1, "WARNING": 2, "WARN": 2, "ERROR": 3, "CRITICAL": 3, "FATAL": 3}
_LEVEL_STYLE = {0: "dim", 1: "", 2: "yellow", 3: "bold red"}


@dataclass(frozen=True)
class LogData:
    name: str
    lines: tuple[str, ...]


def line_levels(lines: tuple[str, ...]) -> list[int]:
    """Level rank of each line; a line without one (a traceback frame) belongs to the line above, except
    the supervisor's own notes (`[supervisor ...]`), which are never part of the server's output before
    them: INFO unless they name a level (`FATAL: ...`)."""
    levels, current = [], 1
    for line in lines:
        match = _LEVEL_RE.search(line)
        if match:
            word = match.group(1)
            current = 3 if word == "Traceback" else _LEVEL_RANK[word]
        elif line.startswith("[supervisor "):
            current = 1
        levels.append(current)
    return levels


class LogsScreen(ConsoleScreen):
    MODE = "logs"
    NEEDS_SERVER = True
    BINDINGS = [
        *ConsoleScreen.BINDINGS,
        Binding("escape", "back", "Back"),
        Binding("slash", "search", "Search"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("v", "cycle_level", "Level"),
        Binding("w", "toggle_wrap", "Wrap"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.follow = True
        # Off, as in k9s: one log line a row keeps the tail readable; `w` wraps a long one (a traceback's
        # message, an error that names its fix) to the screen's width instead of cutting it there.
        self.wrap = False
        self.min_level = 0
        self.search = ""
        self._data: LogData | None = None
        self._shown: tuple[str, ...] = ()

    def compose(self):
        yield from self.compose_header()
        yield TextPanel("", id="logs-title", classes="title")
        yield RichLog(id="logs-view", wrap=False, markup=False, highlight=False, max_lines=5000)
        yield Input(placeholder="search (regex); enter keeps it, esc clears", id="logs-search")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self.query_one("#logs-search", Input).display = False

    def poll_request(self):
        name = self.console.selected
        if name is None:
            return None
        return lambda source: LogData(name, tuple(source.logs(name, TAIL_LINES)))

    def show(self, snapshot: Snapshot) -> None:
        data = snapshot.extra
        if isinstance(data, LogData) and data.name == self.console.selected:
            self._data = data
        self._draw(snapshot.extra_error)

    def _pattern(self) -> re.Pattern | None:
        if not self.search:
            return None
        try:
            return re.compile(self.search, re.IGNORECASE)
        except re.error:
            return re.compile(re.escape(self.search), re.IGNORECASE)

    def _visible(self) -> tuple[list[str], list[int]]:
        if self._data is None:
            return [], []
        pattern = self._pattern()
        lines, ranks = [], []
        for line, rank in zip(self._data.lines, line_levels(self._data.lines), strict=True):
            if rank < self.min_level or (pattern is not None and not pattern.search(line)):
                continue
            lines.append(line)
            ranks.append(rank)
        return lines, ranks

    def _draw(self, error: str | None = None, force: bool = False) -> None:
        name = self.console.selected
        title = Text(f"{name or 'no server selected'}", style="bold")
        title.append(
            f"  log  level>={LEVELS[self.min_level]}  follow {'on' if self.follow else 'off'}"
            f"  wrap {'on' if self.wrap else 'off'}"
        )
        if self.search:
            title.append(f"  search '{self.search}'", style="cyan")
        if error:
            title.append(f"\n{error}", style="bold red")
        lines, ranks = self._visible()
        title.append(f"  ({len(lines)} lines)", style="dim")
        self.query_one("#logs-title", TextPanel).show(title)
        shown = tuple(lines)
        if shown == self._shown and not force:
            return
        view = self.query_one(RichLog)
        pattern = self._pattern()
        old = self._shown
        # Follow mode mostly sees the same tail plus a few lines: append those instead of redrawing.
        overlap = _tail_overlap(old, shown)
        start = overlap if overlap and not force else 0
        if start == 0:
            view.clear()
        for line, rank in zip(lines[start:], ranks[start:], strict=True):
            text = Text(line, style=_LEVEL_STYLE[rank])
            if pattern is not None:
                text.highlight_regex(pattern, style="black on yellow")
            view.write(text, scroll_end=self.follow)
        self._shown = shown

    def action_back(self) -> None:
        box = self.query_one("#logs-search", Input)
        if box.display or self.search:
            box.value, box.display, self.search = "", False, ""
            self.query_one(RichLog).focus()
            self._draw(force=True)
        else:
            self.console.action_switch_screen_to("fleet")

    def action_search(self) -> None:
        box = self.query_one("#logs-search", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.search = event.value
        self._draw(force=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(RichLog).focus()

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        view = self.query_one(RichLog)
        view.auto_scroll = self.follow
        if self.follow:
            view.scroll_end(animate=False)
        self._draw()

    def action_toggle_wrap(self) -> None:
        self.wrap = not self.wrap
        self.query_one(RichLog).wrap = self.wrap
        self._draw(force=True)  # a RichLog lays a line out when it is written: write them all again

    def action_cycle_level(self) -> None:
        self.min_level = (self.min_level + 1) % len(LEVELS)
        self._draw(force=True)

    def on_screen_resume(self) -> None:
        self._data, self._shown = None, ()
        self.query_one(RichLog).clear()
        super().on_screen_resume()


def _tail_overlap(old: tuple[str, ...], new: tuple[str, ...]) -> int:
    """How many leading lines of `new` are already on screen as the end of `old` (0: redraw all).

    The tail window slides as the log grows, so the overlap is some suffix of `old`.
    """
    if not old or not new:
        return 0
    for start in range(len(old)):
        if old[start] != new[0]:
            continue
        size = len(old) - start
        if size <= len(new) and old[start:] == new[:size]:
            return size
    return 0
