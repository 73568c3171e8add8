"""Scrollbars drawn in whole cells.

Textual draws the ends of a scrollbar thumb with eighth-block glyphs (`▁▂▃…`, `▉▊▋…`) for sub-cell
precision. In a 256-colour terminal (tmux's default) the thumb and track colours come out close, and
what remains visible is a stray `▁▁` at the right edge of a log or ServerArgs line, which reads as part
of the line. Whole cells draw the thumb as a solid block and never put a glyph beside the text.
"""

from __future__ import annotations

from textual.scrollbar import ScrollBar, ScrollBarRender


class WholeCellScrollBarRender(ScrollBarRender):
    # Textual skips a thumb end whose glyph is a blank: the thumb then covers whole cells only.
    VERTICAL_BARS = [" "] * len(ScrollBarRender.VERTICAL_BARS)
    HORIZONTAL_BARS = [" "] * len(ScrollBarRender.HORIZONTAL_BARS)


def use_whole_cell_scrollbars() -> None:
    """Every scrollbar of the console in whole cells (Textual's documented way: the ScrollBar class's
    renderer; the console is the only Textual app in its process)."""
    ScrollBar.renderer = WholeCellScrollBarRender
