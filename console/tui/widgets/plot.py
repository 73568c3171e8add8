"""A labelled history plot: a title line with now/min/max and a block-character chart scaled from zero.

Textual's Sparkline stretches min..max to the full height, so a KV usage wobbling between 0.01% and
0.02% looks like a full cache. These charts start at zero and, for ratios, end at 100%.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

_BLOCKS = " ▁▂▃▄▅▆▇█"


def chart_lines(series: Sequence[float], width: int, height: int, top: float | None) -> list[str]:
    """Rows of block characters, newest sample on the right; columns take the max of their samples."""
    if width <= 0 or height <= 0:
        return []
    values = list(series)
    if len(values) > width:
        # Bucket from the right so the newest sample always has a column of its own.
        size = len(values) / width
        values = [
            max(values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)]) for i in range(width)
        ]
    peak = top if top is not None else max(values, default=0.0)
    levels = height * 8
    heights = [0 if peak <= 0 else round(min(max(v, 0.0), peak) / peak * levels) for v in values]
    pad = width - len(heights)
    rows = []
    for row in range(height):
        floor = (height - 1 - row) * 8  # eighths below this row
        cells = [_BLOCKS[min(max(h - floor, 0), 8)] for h in heights]
        rows.append(" " * pad + "".join(cells))
    return rows


class MetricPlot(Widget):
    """One metric's recent history. `update_series` redraws only when the numbers changed.

    Drawn line by line (four Strips cut once per change) rather than as a Static's Text: the series
    slides every poll, and a Static re-wraps and re-styles its whole text each time, which on a screen of
    nine plots was most of the console's CPU at one poll a second. A title wider than the plot is cut,
    not wrapped, so the chart keeps its three rows.
    """

    DEFAULT_CSS = """
    MetricPlot { height: 4; margin: 0 1 0 0; }
    """

    def __init__(
        self,
        title: str,
        render: Callable[[float | None], str],
        *,
        ratio: bool = False,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.title = title
        self.render_value = render
        self.ratio = ratio
        self._series: tuple[float, ...] | None = None
        self._lines: list[list[tuple[str, str]]] = []  # rows of (text, style) runs
        self._strips: dict[int, Strip] = {}  # y -> the row cut at the current width and base style
        self._cut_width = 0
        self._base: Style | None = None  # this widget's resolved style, until the styles change

    def update_series(self, series: Sequence[float]) -> None:
        series = tuple(series)
        if series == self._series:
            return
        self._series = series
        self._draw()

    def on_resize(self) -> None:
        self._lines = []  # every row is cut again at the new width
        self._draw()

    def _draw(self) -> None:
        series = self._series or ()
        title: list[tuple[str, str]] = [(self.title, "bold")]
        if series:
            title.append(
                (
                    f"  now {self.render_value(series[-1])}"
                    f"  min {self.render_value(min(series))}  max {self.render_value(max(series))}"
                    f"  ({len(series)} samples)",
                    "bold",
                )
            )
        else:
            title.append(("  no samples", "bold dim"))
        width = max(self.size.width, 1)
        chart = chart_lines(series, width, 3, 1.0 if self.ratio else None)
        lines = [title, *([(line, "bold cyan")] for line in chart)]
        before, self._lines = self._lines, lines
        if len(before) != len(lines):
            self._strips.clear()
            self.refresh()
            return
        # Only the rows that changed are drawn again: a steady metric's chart keeps its rows while the
        # title's numbers move, and the screen then repaints one line of the plot, not four.
        changed = [y for y, (old, new) in enumerate(zip(before, lines, strict=True)) if old != new]
        for y in changed:
            self._strips.pop(y, None)
        if changed:
            self.refresh(*(Region(0, y, width, 1) for y in changed))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._cut_width != width:
            self._strips.clear()
            self._cut_width = width
        strip = self._strips.get(y)
        if strip is None:
            if self._base is None:
                self._base = self.rich_style  # walks every ancestor's styles: once, not once a line
            base = self._base
            runs = self._lines[y] if y < len(self._lines) else []
            segments = [Segment(text, base + Style.parse(style) if style else base) for text, style in runs]
            strip = Strip(segments).crop_extend(0, width, base)
            self._strips[y] = strip
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._base = None
