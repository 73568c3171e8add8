"""A text panel that redraws only when its text changed, and re-lays the screen out only when its height can.

A Static's `update` re-renders the widget and, by default, lays the whole screen out again; at one poll a
second on every panel of a screen that was most of what an unchanged screen cost. Here an update with the
same content costs a comparison, and one with new content skips the layout when the panel keeps its height:
a fixed CSS height, or the same number of lines, none wider than the panel (so none wraps).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

Shown = Text | str


def _shape(content: Shown) -> tuple[int, int]:
    """(lines, widest line in cells) of a panel's content; markup counts as text, which only overstates."""
    lines = (content.plain if isinstance(content, Text) else content).split("\n")
    return len(lines), max(cell_len(line) for line in lines)


class TextPanel(Static):
    def __init__(self, content: Shown = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(content, id=id, classes=classes)
        self._shown: Shown | None = None
        self._shape: tuple[int, int] | None = None

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
        self._shown, self._shape = content, shape
        self.update(content, layout=not (fixed or same))
