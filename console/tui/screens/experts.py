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
from console.tui.widgets.heatmap import ExpertLoad, Heatmap, hottest, parse_expert_metrics

_EP_KEYS = ("ep_size", "expert_parallel_size", "moe_ep_size")


@dataclass(frozen=True)
class ExpertData:
    name: str
    load: ExpertLoad
    ep_size: int | None
    redundant: int | None = None  # redundant physical slots (ep_num_redundant_experts)


def redundant_of(info: dict[str, Any] | None) -> int | None:
    if not isinstance(info, dict):
        return None
    for scope in (info, info.get("server_args") or {}):
        value = scope.get("ep_num_redundant_experts") if isinstance(scope, dict) else None
        if isinstance(value, int) and value >= 0:
            return value
    return None


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
        self._ep_size: dict[str, tuple[int | None, int | None]] = {}  # server -> (EP size, redundant)
        self._rebalances: dict[str, tuple[float, float]] = {}  # server -> (count, first seen at)
        self._thresholds_for: str | None = None
        self._balanced = 0.8  # [console.thresholds] balancedness of the fleet's profile

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
        size, redundant = self._ep_size.get(name, (None, None))

        def fetch(source: DataSource) -> ExpertData:
            text = source.raw_metrics(name)
            ep, extra = size, redundant
            if not known:
                try:
                    info = source.info(name)
                    ep, extra = ep_size_of(info), redundant_of(info)
                except SourceError:
                    ep, extra = None, None
            return ExpertData(name, parse_expert_metrics(text), ep, extra)

        return fetch

    def show(self, snapshot: Snapshot) -> None:
        name = self.console.selected
        title = Text(f"{name or 'no server selected'}", style="bold")
        title.append("  expert load: tokens per MoE layer x logical expert, over the recorder window")
        data = snapshot.extra
        if snapshot.extra_error:
            title.append(f"\n{snapshot.extra_error}", style="bold red")
        self.query_one("#experts-title", Static).update(title)
        if not isinstance(data, ExpertData) or data.name != name:
            return
        self._ep_size[data.name] = (data.ep_size, data.redundant)
        balanced_at = self._balanced_at(snapshot)
        self.query_one(Heatmap).show_load(data.load, balanced_at)
        self.query_one("#experts-ranks", Static).update(self._summary(data, snapshot.polled_at))

    def _balanced_at(self, snapshot: Snapshot) -> float:
        from console.profile.thresholds import thresholds_of

        path = snapshot.fleet.profile_path if snapshot.fleet is not None else None
        if self._thresholds_for != path:
            self._thresholds_for, self._balanced = path, thresholds_of(path).balancedness
        return self._balanced

    def _summary(self, data: ExpertData, now: float) -> Text:
        text = Text()
        logical = len(data.load.experts)
        if logical:
            slots = logical + (data.redundant or 0)
            line = f"{logical} logical experts in {slots} physical slots"
            if data.redundant:
                line += f" ({data.redundant} redundant replicas of hot experts)"
            if data.ep_size:
                line += f", {slots // data.ep_size} slots on each of {data.ep_size} EP ranks"
            text.append(line + "\n")
            hot = ", ".join(f"expert {e} {share:.0%}" for e, _tokens, share in hottest(data.load))
            text.append(f"hottest (share of all routed tokens): {hot}\n", style="bold")
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
