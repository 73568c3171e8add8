"""Which expert, which rank: a server's expert placement (GET /expert_placement) as the Experts screen tells it.

The server answers, per MoE layer, the logical expert each physical slot holds (slot `s` is on EP rank
`s // slots_per_rank`) and its last rebalance with, per layer, the experts whose EP ranks changed. This
module parses that once (a renamed key breaks here, not in the screen) and writes the lines an operator
reads: where the hottest expert of each layer runs, the slots of each rank with replicas marked, and what
the last rebalance moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

# Layers drawn slot by slot: the least balanced first; a 48-layer model would fill the screen otherwise.
PLACEMENT_LAYERS_SHOWN = 4
CHANGES_SHOWN = 6  # expert changes listed per layer; the rest are counted


@dataclass(frozen=True)
class Rebalance:
    index: int
    layers: tuple[int, ...]
    before: tuple[float, ...]  # balancedness per layer of `layers`, old placement
    after: tuple[float, ...]
    moved_slots: int
    seconds: float | None
    changes: tuple[tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...], ...]  # per layer

    @classmethod
    def from_json(cls, data: Any) -> Rebalance | None:
        if not isinstance(data, dict):
            return None
        layers = tuple(int(x) for x in data.get("layers") or [])
        changes = []
        for row in data.get("changes") or [[] for _ in layers]:
            changes.append(tuple((int(e), tuple(map(int, a)), tuple(map(int, b))) for e, a, b in row))
        return cls(
            index=int(data.get("index") or 0),
            layers=layers,
            before=tuple(float(x) for x in data.get("balancedness_before") or []),
            after=tuple(float(x) for x in data.get("balancedness_after") or []),
            moved_slots=int(data.get("moved_slots") or 0),
            seconds=float(data["seconds"]) if isinstance(data.get("seconds"), (int, float)) else None,
            changes=tuple(changes),
        )


@dataclass(frozen=True)
class Placement:
    ep_size: int
    slots_per_rank: int
    num_logical: int
    slots: dict[int, tuple[int, ...]]  # layer -> logical expert of each physical slot
    rebalances: int = 0
    last: Rebalance | None = None
    _ranks: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Placement:
        """ValueError when the answer is not a placement (an older server, a torn answer)."""
        if not isinstance(data, dict) or not isinstance(data.get("phy2log"), list):
            raise ValueError("the server's /expert_placement answer has no placement")
        layers = [int(x) for x in data.get("layers") or []]
        rows = data["phy2log"]
        if len(rows) != len(layers):
            raise ValueError("the server's /expert_placement answer has one row per layer missing")
        return cls(
            ep_size=max(int(data.get("ep_size") or 1), 1),
            slots_per_rank=max(int(data.get("slots_per_rank") or 1), 1),
            num_logical=int(data.get("num_logical") or 0),
            slots={layer: tuple(int(e) for e in row) for layer, row in zip(layers, rows, strict=True)},
            rebalances=int(data.get("rebalances") or 0),
            last=Rebalance.from_json(data.get("last_rebalance")),
        )

    @property
    def num_physical(self) -> int:
        return self.ep_size * self.slots_per_rank

    def ranks_of(self, layer: int, expert: int) -> tuple[int, ...]:
        """The EP ranks holding `expert` in `layer` (a rank twice: two replicas there); () if unknown."""
        if layer not in self._ranks:
            per: dict[int, list[int]] = {}
            for slot, e in enumerate(self.slots.get(layer, ())):
                per.setdefault(e, []).append(slot // self.slots_per_rank)
            self._ranks[layer] = {e: tuple(sorted(r)) for e, r in per.items()}
        return self._ranks[layer].get(expert, ())


def ranks_text(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def change_text(expert: int, before: tuple[int, ...], after: tuple[int, ...]) -> str:
    """"expert 3: rank 1 -> ranks 0,1 (+1 replica)": the EP ranks of one expert before and after."""
    line = f"expert {expert}: {ranks_text(before)} -> {ranks_text(after)}"
    extra = len(after) - len(before)
    if extra:
        line += f" ({extra:+d} replica{'s' if abs(extra) > 1 else ''})"
    return line


def hot_spots(load: dict[int, dict[int, float]], placement: Placement | None,
              balancedness: dict[int, float]) -> list[tuple[int, int, float, tuple[int, ...]]]:  # fmt: skip
    """Per layer, least balanced first: (layer, hottest expert, its share of the layer's tokens, its ranks)."""
    out = []
    for layer, row in load.items():
        total = sum(row.values())
        if total <= 0:
            continue
        expert, tokens = max(row.items(), key=lambda kv: (kv[1], -kv[0]))
        ranks = placement.ranks_of(layer, expert) if placement is not None else ()
        out.append((layer, expert, tokens / total, ranks))
    return sorted(out, key=lambda h: (balancedness.get(h[0], 1.0), h[0]))


def placement_lines(placement: Placement, layers: list[int]) -> Text:
    """Each rank's slots for `layers`: the logical expert per slot, `*` on an expert with several replicas."""
    text = Text()
    per = placement.slots_per_rank
    for layer in layers[:PLACEMENT_LAYERS_SHOWN]:
        slots = placement.slots.get(layer)
        if slots is None:
            continue
        counts: dict[int, int] = {}
        for e in slots:
            counts[e] = counts.get(e, 0) + 1
        text.append(f"  layer {layer:>3}  ")
        for rank in range(placement.ep_size):
            if rank:
                text.append(" | ", style="dim")
            text.append(f"rank {rank}:", style="bold")
            for e in slots[rank * per : (rank + 1) * per]:
                text.append(f" {e}" + ("*" if counts[e] > 1 else ""), style="yellow" if counts[e] > 1 else "")
        text.append("\n")
    hidden = len(layers) - PLACEMENT_LAYERS_SHOWN
    if hidden > 0:
        text.append(f"  ({hidden} more layers: GET /expert_placement on the server)\n", style="dim")
    return text


def rebalance_lines(last: Rebalance, seen_at: str | None, balanced_at: float) -> Text:
    """The last rebalance per layer: balancedness before -> after, and the experts whose ranks changed."""
    text = Text()
    mean_before = sum(last.before) / len(last.before) if last.before else None
    mean_after = sum(last.after) / len(last.after) if last.after else None
    head = f"last rebalance #{last.index}"
    if seen_at:
        head += f" (seen at or before {seen_at})"
    if mean_before is not None and mean_after is not None:
        head += f": balancedness {mean_before:.2f} -> {mean_after:.2f}"
    head += f", {last.moved_slots} slots moved"
    text.append(head + "\n", style="bold")
    for i, layer in enumerate(last.layers):
        before = last.before[i] if i < len(last.before) else None
        after = last.after[i] if i < len(last.after) else None
        changes = last.changes[i] if i < len(last.changes) else ()
        text.append(f"  layer {layer:>3}  ")
        if before is not None and after is not None:
            text.append(f"{before:.2f}", style="bold red" if before < balanced_at else "")
            text.append(" -> ")
            text.append(f"{after:.2f}", style="bold red" if after < balanced_at else "green")
        if not changes:
            text.append("  no expert changed rank\n", style="dim")
            continue
        shown = [change_text(e, a, b) for e, a, b in changes[:CHANGES_SHOWN]]
        more = len(changes) - CHANGES_SHOWN
        text.append("  " + "; ".join(shown) + (f"; {more} more" if more > 0 else "") + "\n")
    return text
