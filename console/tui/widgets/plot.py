"""A labelled history plot: a title line with now/min/max and a Sparkline that rescales to its data."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Label, Sparkline


class MetricPlot(Vertical):
    """One metric's recent history. `update_series` redraws only when the numbers changed."""

    DEFAULT_CSS = """
    MetricPlot { height: 4; margin: 0 1 0 0; }
    MetricPlot > Label { width: 100%; }
    MetricPlot > Sparkline { height: 3; }
    """

    def __init__(self, title: str, render: Callable[[float | None], str], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.render_value = render
        self._series: tuple[float, ...] | None = None

    def compose(self):
        yield Label(Text(self.title, style="bold"))
        yield Sparkline([], summary_function=max)

    def update_series(self, series: Sequence[float]) -> None:
        series = tuple(series)
        if series == self._series:
            return
        self._series = series
        label = Text(self.title, style="bold")
        if series:
            label.append(
                f"  now {self.render_value(series[-1])}"
                f"  min {self.render_value(min(series))}  max {self.render_value(max(series))}"
                f"  ({len(series)} samples)"
            )
        else:
            label.append("  no samples", style="dim")
        self.query_one(Label).update(label)
        self.query_one(Sparkline).data = list(series) if series else [0.0]
