"""Experts screen: layer x expert load heatmap, balancedness per layer and per EP rank, which expert runs on
which rank (the server's placement, replicas marked) and what the last rebalance moved.

`B` rebalances the selected (or marked) servers' experts now, after a confirmation; the notification
gives the balancedness before and after, and this screen the experts that changed rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import HorizontalScroll, VerticalScroll

from console.tui.expert_placement import Placement, hot_spots, placement_lines, ranks_text, rebalance_lines
from console.tui.model import Snapshot
from console.tui.moe_servers import next_moe_server, no_expert_load_text
from console.tui.screens.base import ConsoleScreen
from console.tui.source import DataSource, SourceError
from console.tui.widgets.heatmap import ExpertLoad, Heatmap, expert_lines, hottest, parse_expert_lines
from console.tui.widgets.panel import TextPanel

_EP_KEYS = ("ep_size", "expert_parallel_size", "moe_ep_size")


@dataclass(frozen=True)
class ExpertData:
    name: str
    load: ExpertLoad
    ep_size: int | None
    redundant: int | None = None  # redundant physical slots (ep_num_redundant_experts)
    placement: Placement | None = None
    placement_error: str | None = None
    expert_text: str = ""  # the expert lines of /metrics `load` was parsed from


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
        # a dense server has no experts: show the next server that has (console/tui/moe_servers.py)
        Binding("m", "next_moe_server", "MoE server"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._ep_size: dict[str, tuple[int | None, int | None]] = {}  # server -> (EP size, redundant)
        self._rebalances: dict[str, tuple[float, float]] = {}  # server -> (count, first seen at)
        # server -> (rebalance count it was fetched at, placement, why there is none): the placement only
        # changes with a rebalance (or a new process, whose count starts over), so it is fetched again then
        self._placements: dict[str, tuple[float | None, Placement | None, str | None]] = {}
        # server -> (its expert lines of /metrics, what they parsed to): an idle server's are the same each poll
        self._parsed: dict[str, tuple[str, ExpertLoad]] = {}
        self._thresholds_for: str | None = None
        self._balanced = 0.8  # [console.thresholds] balancedness of the fleet's profile

    def compose(self):
        yield from self.compose_header()
        # TextPanels: each poll redraws only what changed, and lays the screen out only when a height can change
        yield TextPanel("", id="experts-title", classes="title")
        with VerticalScroll(id="experts-body"):
            with HorizontalScroll(id="experts-scroll"):
                yield Heatmap("", id="experts-heatmap")
            yield TextPanel("", id="experts-ranks")
        yield from self.compose_footer()

    def poll_request(self):
        name = self.console.selected
        if name is None:
            return None
        known = name in self._ep_size
        size, redundant = self._ep_size.get(name, (None, None))
        cached = self._placements.get(name)
        parsed = self._parsed.get(name)

        def fetch(source: DataSource) -> ExpertData:
            text = source.raw_metrics(name)
            ep, extra = size, redundant
            if not known:
                try:
                    info = source.info(name)
                    ep, extra = ep_size_of(info), redundant_of(info)
                except SourceError:
                    ep, extra = None, None
            lines = expert_lines(text)
            if parsed is not None and parsed[0] == lines:
                load = parsed[1]
            else:
                load = parse_expert_lines(lines)
            placement, why = (cached[1], cached[2]) if cached is not None else (None, None)
            if load.load and (cached is None or cached[0] != load.rebalances):
                placement, why = fetch_placement(source, name)
            return ExpertData(name, load, ep, extra, placement, why, lines)

        return fetch

    def show(self, snapshot: Snapshot) -> None:
        name = self.console.selected
        title = Text(f"{name or 'no server selected'}", style="bold")
        title.append("  expert load: tokens per MoE layer x logical expert, over the recorder window")
        data = snapshot.extra
        if snapshot.extra_error:
            title.append(f"\n{snapshot.extra_error}", style="bold red")
        self.query_one("#experts-title", TextPanel).show(title)
        if not isinstance(data, ExpertData) or data.name != name:
            return
        self._ep_size[data.name] = (data.ep_size, data.redundant)
        self._parsed[data.name] = (data.expert_text, data.load)
        if data.load.load:
            self._placements[data.name] = (data.load.rebalances, data.placement, data.placement_error)
        balanced_at = self._balanced_at(snapshot)
        if data.load.layers:
            self.query_one(Heatmap).show_load(data.load, balanced_at)
        else:
            self.query_one(Heatmap).show(no_expert_load_text(snapshot.fleet, name))
        self.query_one("#experts-ranks", TextPanel).show(self._summary(data, snapshot.polled_at))

    def action_next_moe_server(self) -> None:
        snapshot = self.console.snapshot
        fleet = snapshot.fleet if snapshot is not None else None
        target = next_moe_server(fleet, self.console.selected)
        if target is None:
            self.notify("no server of this fleet serves a MoE model", severity="warning", timeout=4)
            return
        self.console.selected = target
        self.console.poll_now()

    def _balanced_at(self, snapshot: Snapshot) -> float:
        from console.profile.thresholds import thresholds_of

        path = snapshot.fleet.profile_path if snapshot.fleet is not None else None
        if self._thresholds_for != path:
            self._thresholds_for, self._balanced = path, thresholds_of(path).balancedness
        return self._balanced

    def _summary(self, data: ExpertData, now: float) -> Text:
        text = Text()
        logical = len(data.load.experts)
        placement = data.placement
        if logical:
            redundant = data.redundant
            ep_size = data.ep_size
            if placement is not None:
                redundant, ep_size = placement.num_physical - placement.num_logical, placement.ep_size
            slots = logical + (redundant or 0)
            line = f"{logical} logical experts in {slots} physical slots"
            if redundant:
                line += f" ({redundant} redundant replicas of hot experts)"
            if ep_size:
                line += f", {slots // ep_size} slots on each of {ep_size} EP ranks"
            text.append(line + "\n")
            ranked = [h for h in hottest(data.load) if h[1] > 0]
            if ranked:
                hot = ", ".join(f"expert {e} {share:.0%}" for e, _tokens, share in ranked)
                text.append(f"hottest (share of all routed tokens): {hot}\n", style="bold")
            else:
                text.append("no tokens routed in the recorder window yet (it restarts with each rebalance)\n",
                            style="dim")  # fmt: skip
            text.append_text(self._where(data))
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
        seen_at = time.strftime("%H:%M:%S", time.localtime(seen[1]))
        text.append(f"rebalances: {count:.0f}")
        if count > 0:
            text.append(f"  last one seen at or before {seen_at}")
        if placement is not None and placement.last is not None and count > 0:
            text.append("\n")
            text.append_text(rebalance_lines(placement.last, seen_at, self._balanced))
        return text

    def _where(self, data: ExpertData) -> Text:
        """Which expert, which rank: each layer's hottest expert and the ranks serving it, least balanced
        layer first, then every rank's slots."""
        text = Text()
        placement, balanced = data.placement, data.load.balancedness
        spots = hot_spots(data.load.load, placement, balanced)
        if not spots:
            return text
        text.append("hottest expert per layer (least balanced first):\n", style="bold")
        for layer, expert, share, ranks in spots[:8]:
            bal = balanced.get(layer)
            text.append(f"  layer {layer:>3}  expert {expert:>3}  {share:>4.0%} of the layer's tokens  ")
            text.append(f"on {ranks_text(ranks)}" if ranks else "rank unknown", style="bold")
            if len(ranks) > 1:
                text.append(f" ({len(ranks)} replicas)")
            if bal is not None:
                text.append("  balancedness ")
                text.append(f"{bal:.2f}", style="bold red" if bal < self._balanced else "")
            text.append("\n")
        if placement is None:
            text.append(f"placement: {data.placement_error or 'not known yet'}\n", style="dim")
            return text
        text.append("placement (logical expert in each slot; * = an expert with replicas):\n", style="bold")
        text.append_text(placement_lines(placement, [layer for layer, *_ in spots]))
        return text


def fetch_placement(source: DataSource, name: str) -> tuple[Placement | None, str | None]:
    """The server's placement, or None and why (a replay, a server without one, an older server)."""
    try:
        return Placement.from_json(source.expert_placement(name)), None
    except (SourceError, ValueError, TypeError) as exc:
        return None, str(exc)
