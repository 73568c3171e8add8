"""A row table for many servers that redraws only what changed (Textual's line API).

DataTable re-renders every visible cell whenever any cell changes and re-measures whole columns on
width updates; with 64 servers polled every second that was most of the console's CPU. Here each
row is one Rich Text laid out by the caller with fixed column widths, rendered to a Strip once per
change, and only the rows whose text changed (or the cursor moved over) are repainted.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip


def _segments(text: Text, base: Style) -> list[Segment] | None:
    """The segments of a row built from cells that each have one style (spans in order, none overlapping):
    cut straight from the text, without Rich's general renderer. None for any other text."""
    plain, pos, out = text.plain, 0, []
    for span in text.spans:
        if span.start < pos:
            return None
        if span.start > pos:
            out.append(Segment(plain[pos : span.start], base))
        style = Style.parse(span.style) if isinstance(span.style, str) else span.style
        out.append(Segment(plain[span.start : span.end], base + style))
        pos = span.end
    if pos < len(plain):
        out.append(Segment(plain[pos:], base))
    return out if not text.style else None


class ServerTable(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    ServerTable { height: 1fr; }
    ServerTable > .server-table--cursor { background: $accent; text-style: bold; }
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
        self._texts: list[Text] = []
        self._strips: dict[tuple[int, int], Strip] = {}  # (row, look) -> rendered line
        self._width = 0
        self._base: Style | None = None  # this widget's resolved style, until the styles change

    # ------------------------------------------------------------------ data

    def set_rows(self, rows: list[tuple[str, Text]], width: int, keep: str | None = None) -> None:
        """Replace the rows; `keep` names the server the cursor should stay on."""
        names = tuple(name for name, _ in rows)
        texts = [text for _, text in rows]
        if names == self.names and width == self._width:
            for index, (old, new) in enumerate(zip(self._texts, texts, strict=True)):
                if old != new:
                    self._forget(index)
                    self.refresh_line(index)
            self._texts = texts
            return
        self.names, self._texts, self._width = names, texts, width
        self._strips.clear()
        self.virtual_size = Size(width, len(names))
        target = names.index(keep) if keep in names else min(self.cursor, max(len(names) - 1, 0))
        self.cursor = target
        self.refresh()

    def _forget(self, index: int) -> None:
        for look in (0, 1, 2):
            self._strips.pop((index, look), None)

    @property
    def current(self) -> str | None:
        return self.names[self.cursor] if 0 <= self.cursor < len(self.names) else None

    def row_text(self, name: str) -> str:
        return self._texts[self.names.index(name)].plain

    # ------------------------------------------------------------------ drawing

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = y + scroll_y
        width = self.size.width
        if self._base is None:
            self._base = self.rich_style  # walks every ancestor's styles: once, not once a line
        base = self._base
        if index >= len(self._texts):
            return Strip.blank(width, base)
        look = 2 if index == self.cursor else (1 if index % 2 else 0)
        strip = self._strips.get((index, look))
        if strip is None:
            text = self._texts[index]
            if look == 2 and text.plain.startswith(" "):
                # A marker, not only a colour: 256-colour terminals blend a tinted background into the rows'.
                text = Text("▶", style="bold") + text[1:]
            segments = _segments(text, base) or [
                Segment(s.text, base + s.style if s.style else base) for s in text.render(self.app.console)
            ]
            strip = Strip(segments, text.cell_len).extend_cell_length(max(self._width, width), base)
            if look == 2:
                strip = strip.apply_style(self.get_component_rich_style("server-table--cursor"))
            elif look == 1:
                strip = strip.apply_style(self.get_component_rich_style("server-table--zebra"))
            self._strips[(index, look)] = strip
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
