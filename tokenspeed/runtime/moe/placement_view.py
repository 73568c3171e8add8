"""Where the experts are, in plain values an operator's tools read: GET /expert_placement and the rebalance answer.

A placement is `phy2log[layer][slot]` (the logical expert each physical slot holds); slot `s` lives on EP
rank `s // slots_per_rank`. What matters to an operator is *which rank* serves an expert, so a rebalance's
changes are told per logical expert as the EP ranks holding it before and after (a rank listed twice holds
two replicas); a slot that moved inside one rank changes nothing there and is left out.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenspeed.runtime.moe.expert_location import ExpertLocation


def expert_ranks(slots: list[int], slots_per_rank: int, num_logical: int) -> list[list[int]]:
    """Per logical expert, the EP ranks of the slots holding it, sorted (repeated for two replicas on one rank)."""
    ranks: list[list[int]] = [[] for _ in range(num_logical)]
    for slot, expert in enumerate(slots):
        ranks[expert].append(slot // slots_per_rank)
    return [sorted(r) for r in ranks]


def placement_changes(
    old: torch.Tensor, new: torch.Tensor, slots_per_rank: int, num_logical: int, layers: list[int]
) -> list[list[list[Any]]]:
    """Per layer of `layers`, `[expert, ranks_before, ranks_after]` for each logical expert whose ranks changed:
    moved (same count, other ranks), given a replica (more) or losing one (fewer)."""
    out = []
    for layer in layers:
        before = expert_ranks(old[layer].tolist(), slots_per_rank, num_logical)
        after = expert_ranks(new[layer].tolist(), slots_per_rank, num_logical)
        out.append([[e, before[e], after[e]] for e in range(num_logical) if before[e] != after[e]])
    return out


def placement_answer(
    location: ExpertLocation | None, layers: list[int], num_logical: int, rebalances: int, last: dict | None
) -> dict[str, Any]:
    """The current placement of `layers` (no `location`: one EP rank, slot i holds expert i) and the last
    rebalance (None before the first)."""
    if location is None:
        ep_size, slots_per_rank = 1, num_logical
        rows = [list(range(num_logical)) for _ in layers]
    else:
        ep_size, slots_per_rank = location.ep_size, location.slots_per_rank
        rows = [location.placement.phy2log[layer].tolist() for layer in layers]
    return {
        "ep_size": ep_size,
        "num_logical": num_logical,
        "num_physical": ep_size * slots_per_rank,
        "slots_per_rank": slots_per_rank,
        "layers": list(layers),
        "phy2log": rows,
        "rebalances": rebalances,
        "last_rebalance": last,
    }
