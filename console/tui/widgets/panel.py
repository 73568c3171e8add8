"""A text panel that redraws only what changed: nothing for the same text, only the changed lines for a new
text of the same shape, and the screen's layout only when the panel's height can change.

A Static's `update` renders its whole text again and, by default, lays the whole screen out again; at one
poll a second on every panel of a screen that was most of what an unchanged screen cost. Here an update
with the same content costs a comparison. One with new content skips the layout when the panel keeps its
height: a fixed CSS height, or the same number of lines, none wider than the panel (so none wraps). Such
an update also keeps the lines that did not change: a panel of twenty lines where one number moved
renders and repaints one line, not twenty.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.content import Content
from textual.geometry import Region
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widgets import Static

Shown = Text | str


def _shape(content: Shown) -> tuple[int, int]:
    """(lines, widest line in cells) of a panel's content; markup counts as text, which only overstates."""
    lines = (content.plain if isinstance(content, Text) else content).split("\n")
    return len(lines), max(cell_len(line) for line in lines)


def _key(line: Content) -> tuple[str, tuple]:
    """What a line draws: its text and its styles (a Content compares by text alone)."""
    return line.plain, tuple(line.spans)


class TextPanel(Static):
    def __init__(self, content: Shown = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(content, id=id, classes=classes)
        self._shown: Shown | None = None
        self._shape: tuple[int, int] | None = None
        # The lines of what is shown, while they are drawn one by one (None: drawn by Static, whole)
        self._lines: list[Content] | None = None

    def show(self, content: Shown) -> None:
        """Draw `content`, unless it is what the panel shows already."""
        if self._shown is not None and content == self._shown:
            return
        shape = _shape(content)
        height = self.styles.height
        fixed = height is not None and height.is_cells
        width = self.content_size.width
        same = (
            self._shape is not None
            and shape[0] == self._shape[0]
            and max(shape[1], self._shape[1]) <= width
            and self.is_mounted
        )
        before = self._shown
        self._shown, self._shape = content, shape
        if same and before is not None and self._update_lines(before, content):
            return
        self._lines = None
        self.update(content, layout=not (fixed or same))

    def _update_lines(self, before: Shown, content: Shown) -> bool:
        """Show `content` (as many lines as `before`, none wider than the panel) by drawing again only the
        lines that differ; False where the panel must be drawn whole (a text selection, aligned content)."""
        if (
            self.text_selection is not None
            or self.styles.content_align != ("left", "top")
            or not hasattr(self, "_Static__visual")  # the Static this was written against
        ):
            return False
        old = self._lines if self._lines is not None else self._split(before)
        visual = visualize(self, content, markup=self._render_markup)
        if not isinstance(visual, Content):
            return False
        new = visual.split(allow_blank=True)
        if len(new) != len(old):
            return False
        # What Static.update keeps, without its repaint of every line.
        self._Static__content = content
        self._Static__visual = visual
        self._lines = new
        width = self.size.width
        changed = [y for y, (was, now) in enumerate(zip(old, new, strict=True)) if _key(was) != _key(now)]
        if changed:
            self.refresh(*(Region(0, y, width, 1) for y in changed))
        return True

    def _split(self, content: Shown) -> list[Content]:
        visual = visualize(self, content, markup=self._render_markup)
        return visual.split(allow_blank=True) if isinstance(visual, Content) else []

    def render_line(self, y: int) -> Strip:
        lines = self._lines
        if lines is None:
            return super().render_line(y)
        if y >= len(lines):
            return Strip.blank(self.size.width, self.visual_style.rich_style)
        strips = Visual.to_strips(self, lines[y], self.size.width, None, self.visual_style)
        if not strips:
            return Strip.blank(self.size.width, self.visual_style.rich_style)
        # Drawn alone, the line's cells say they are on row 0; a selection reads the row from them.
        return strips[0].apply_offsets(0, y) if y else strips[0]

    def on_resize(self) -> None:
        # A new width can wrap a line: Static draws the whole text again.
        if self._lines is not None:
            self._lines = None
            self.refresh()

    def selection_updated(self, selection) -> None:
        self._lines = None  # a selection is drawn over the whole text, by Static
        super().selection_updated(selection)
