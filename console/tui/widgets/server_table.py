"""A row table for many servers that redraws only what changed (Textual's line API).

DataTable re-renders every visible cell whenever any cell changes and re-measures whole columns on
width updates; with 64 servers polled every second that was most of the console's CPU. Here each
row is a tuple of cells (text and a style) laid out with the caller's column widths, cut into one Strip
once per change (no Rich Text, no Strip copies for padding, zebra or cursor), and only the rows whose
cells changed (or the cursor moved over) are repainted.
"""

from __future__ import annotations

from typing import NamedTuple

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

CURSOR, ZEBRA, PLAIN = 2, 1, 0  # how a row looks


class Cell(NamedTuple):
    """One table cell: its text and a Rich style string ("" for the row's own)."""

    plain: str
    style: str = ""

    @property
    def cell_len(self) -> int:
        plain = self.plain
        return len(plain) if plain.isascii() else cell_len(plain)  # numbers and names: one cell a character


Row = tuple[Cell, ...]


class ServerTable(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    ServerTable { height: 1fr; }
    ServerTable > .server-table--cursor { background: $block-cursor-background; text-style: bold; }
    ServerTable > .server-table--zebra { background: $surface-lighten-1 30%; }
    """
    COMPONENT_CLASSES = {"server-table--cursor", "server-table--zebra"}
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "move_to(0)", "First", show=False),
        Binding("end", "move_to(-1)", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    cursor = reactive(0, always_update=True, repaint=False)

    class Highlighted(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    class Selected(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.names: tuple[str, ...] = ()
        self._rows: list[Row] = []
        self._widths: tuple[int, ...] = ()
        self._strips: dict[tuple[int, int], Strip] = {}  # (row, look) -> rendered line
        self._width = 0
        self._base: Style | None = None  # this widget's resolved style, until the styles change
        self._styles: dict[tuple[str, int], Style] = {}  # (cell style, look) -> the style drawn

    # ------------------------------------------------------------------ data

    def set_rows(self, rows: list[tuple[str, Row]], widths: list[int], keep: str | None = None) -> None:
        """Replace the rows (cells laid out in columns of `widths`, two spaces apart); `keep` names the
        server the cursor should stay on."""
        names = tuple(name for name, _ in rows)
        cells = [row for _, row in rows]
        widths = tuple(widths)
        width = sum(widths) + 2 * len(widths) + 1
        if names == self.names and widths == self._widths:
            for index, (old, new) in enumerate(zip(self._rows, cells, strict=True)):
                if old != new:
                    self._forget(index)
                    self.refresh_line(index - self.scroll_offset.y)
            self._rows = cells
            return
        self.names, self._rows, self._widths, self._width = names, cells, widths, width
        self._strips.clear()
        self.virtual_size = Size(width, len(names))
        target = names.index(keep) if keep in names else min(self.cursor, max(len(names) - 1, 0))
        self.cursor = target
        self.refresh()

    def _forget(self, index: int) -> None:
        for look in (PLAIN, ZEBRA, CURSOR):
            self._strips.pop((index, look), None)

    @property
    def current(self) -> str | None:
        return self.names[self.cursor] if 0 <= self.cursor < len(self.names) else None

    # ------------------------------------------------------------------ drawing

    def _style(self, cell_style: str, look: int) -> Style:
        """The drawn style of a cell: the widget's, over it the cursor or zebra background, over that the
        cell's own (its colour stays; the cursor's background is not covered by the widget's)."""
        style = self._styles.get((cell_style, look))
        if style is None:
            style = self._base or self.rich_style
            if look == CURSOR:
                style = style + self.get_component_rich_style("server-table--cursor")
            elif look == ZEBRA:
                style = style + self.get_component_rich_style("server-table--zebra")
            if cell_style:
                style = style + Style.parse(cell_style)
            self._styles[(cell_style, look)] = style
        return style

    def _strip(self, row: Row, look: int, width: int) -> Strip:
        """One row as segments: unstyled runs (padding included) merged into one segment each."""
        out: list[Segment] = []
        run = " "
        if look == CURSOR:
            # A marker, not only a colour: 256-colour terminals blend a tinted background into the rows'.
            out.append(Segment("▶", self._style("bold", look)))
            run = ""
        for cell, column in zip(row, self._widths, strict=True):
            if cell.style:
                if run:
                    out.append(Segment(run, self._style("", look)))
                out.append(Segment(cell.plain, self._style(cell.style, look)))
                run = ""
            else:
                run += cell.plain
            run += " " * (column - cell.cell_len + 2)
        length = max(self._width, width)
        run += " " * (length - self._width)
        if run:
            out.append(Segment(run, self._style("", look)))
        return Strip(out, length)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = y + scroll_y
        width = self.size.width
        if self._base is None:
            self._base = self.rich_style  # walks every ancestor's styles: once, not once a line
        base = self._base
        if index >= len(self._rows):
            return Strip.blank(width, base)
        look = CURSOR if index == self.cursor else (ZEBRA if index % 2 else PLAIN)
        strip = self._strips.get((index, look))
        if strip is None:
            strip = self._strips[(index, look)] = self._strip(self._rows[index], look, width)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh_line(old - self.scroll_offset.y)
        self.refresh_line(new - self.scroll_offset.y)
        if self.names:
            self.scroll_to_region(Region(0, new, 1, 1), animate=False, force=True)
            self.post_message(self.Highlighted(self.names[new]))

    def refresh_line(self, y: int) -> None:
        if 0 <= y < self.size.height:
            super().refresh_line(y)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._styles.clear()
        self._base = None

    # ------------------------------------------------------------------ moving

    def action_move(self, step: int) -> None:
        if self.names:
            self.cursor = min(max(self.cursor + step, 0), len(self.names) - 1)

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(self.size.height - 1, 1))

    def action_move_to(self, index: int) -> None:
        if self.names:
            self.cursor = index % len(self.names)

    def action_select(self) -> None:
        if self.current is not None:
            self.post_message(self.Selected(self.current))

    def on_click(self, event: Click) -> None:
        index = event.y + self.scroll_offset.y
        if 0 <= index < len(self.names):
            if index == self.cursor and event.chain >= 2:
                self.action_select()
            self.cursor = index
