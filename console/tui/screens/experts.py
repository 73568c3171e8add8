"""Experts screen: layer x expert load heatmap, balancedness per layer and per EP rank, last rebalance.

`B` rebalances the selected (or marked) servers' experts now, after a confirmation; the notification
gives the balancedness before and after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import HorizontalScroll, VerticalScroll
from textual.widgets import Static

from console.tui.model import Snapshot
from console.tui.screens.base import ConsoleScreen
from console.tui.source import DataSource, SourceError
from console.tui.widgets.heatmap import ExpertLoad, Heatmap, parse_expert_metrics

_EP_KEYS = ("ep_size", "expert_parallel_size", "moe_ep_size")


@dataclass(frozen=True)
class ExpertData:
    name: str
    load: ExpertLoad
    ep_size: int | None


def ep_size_of(info: dict[str, Any] | None) -> int | None:
    if not isinstance(info, dict):
        return None
    for scope in (info, info.get("server_args") or {}):
        for key in _EP_KEYS:
            value = scope.get(key) if isinstance(scope, dict) else None
            if isinstance(value, int) and value > 0:
                return value
    return None


class ExpertsScreen(ConsoleScreen):
    MODE = "experts"
    NEEDS_SERVER = True
    BINDINGS = [
        *ConsoleScreen.BINDINGS,
        Binding("escape", "app.switch_screen_to('fleet')", "Back"),
        # one EPLB rebalance now, from the load recorded so far (asks first: it moves expert weights)
        Binding("B", "app.server_action('rebalance_experts')", "Rebalance"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._ep_size: dict[str, int | None] = {}
        self._rebalances: dict[str, tuple[float, float]] = {}  # server -> (count, first seen at)

    def compose(self):
        yield from self.compose_header()
        yield Static("", id="experts-title", classes="title")
        with VerticalScroll(id="experts-body"):
            with HorizontalScroll(id="experts-scroll"):
                yield Heatmap("", id="experts-heatmap")
            yield Static("", id="experts-ranks")
        yield from self.compose_footer()

    def poll_request(self):
        name = self.console.selected
        if name is None:
            return None
        known = name in self._ep_size
        ep_size = self._ep_size.get(name)

        def fetch(source: DataSource) -> ExpertData:
            text = source.raw_metrics(name)
            size = ep_size
            if not known:
                try:
                    size = ep_size_of(source.info(name))
                except SourceError:
                    size = None
            return ExpertData(name, parse_expert_metrics(text), size)

        return fetch

    def show(self, snapshot: Snapshot) -> None:
        name = self.console.selected
        title = Text(f"{name or 'no server selected'}", style="bold")
        title.append("  expert load (tokens per layer x physical expert)")
        data = snapshot.extra
        if snapshot.extra_error:
            title.append(f"\n{snapshot.extra_error}", style="bold red")
        self.query_one("#experts-title", Static).update(title)
        if not isinstance(data, ExpertData) or data.name != name:
            return
        self._ep_size[data.name] = data.ep_size
        self.query_one(Heatmap).show_load(data.load)
        self.query_one("#experts-ranks", Static).update(self._summary(data, snapshot.polled_at))

    def _summary(self, data: ExpertData, now: float) -> Text:
        text = Text()
        loads = data.load.rank_loads(data.ep_size)
        if loads:
            peak = max(loads.values()) or 1.0
            mean = sum(loads.values()) / len(loads)
            text.append(f"per EP rank (balancedness mean/max = {mean / peak:.2f}):\n", style="bold")
            for rank, value in sorted(loads.items()):
                bar = "█" * int(30 * value / peak)
                text.append(f"  rank {rank:>3}  {value:>10.0f}  {bar}\n")
        if data.load.balancedness:
            worst = min(data.load.balancedness.items(), key=lambda kv: kv[1])
            text.append(f"worst layer: {worst[0]} balancedness {worst[1]:.2f}\n")
        count = data.load.rebalances
        if count is None:
            text.append("rebalances: not exported", style="dim")
            return text
        seen = self._rebalances.get(data.name)
        if seen is None or seen[0] != count:
            seen = (count, now)
            self._rebalances[data.name] = seen
        text.append(f"rebalances: {count:.0f}")
        if count > 0:
            text.append(f"  last one seen at or before {time.strftime('%H:%M:%S', time.localtime(seen[1]))}")
        return text
