"""Expert-load figures of one scheduler, from its recorder: what /metrics and /get_server_info show.

- `load[layer][expert]`: tokens routed to each logical expert of each MoE layer over the recorder window;
- `rank_load[layer][rank]`: tokens computed by each EP rank (through the physical slots it holds);
- `balancedness[layer]`: mean over max of the per-rank load (1.0 is perfect; 1.0 too when idle).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenspeed.runtime.moe.eplb_algorithm import balancedness


@dataclass
class ExpertLoadSnapshot:
    layers: list[int]
    load: list[list[int]]
    rank_load: list[list[int]]
    balancedness: list[float]
    rebalances: int = 0
    rebalance_seconds: float = 0.0  # decoding stalled by all rebalances so far
    recording: bool = False
    passes: int = 0


def expert_load_snapshot(
    physical_counts: torch.Tensor,
    moe_layers: list[int],
    phy2log: torch.Tensor | None,
    num_logical: int,
    ep_size: int,
) -> ExpertLoadSnapshot:
    """Figures for `moe_layers` from tokens per (layer, physical slot); no `phy2log` = slots are experts."""
    counts = physical_counts[moe_layers].to(torch.int64)
    if phy2log is None:
        logical = counts
    else:
        logical = torch.zeros((len(moe_layers), num_logical), dtype=torch.int64)
        logical.scatter_add_(1, phy2log[moe_layers].to(torch.int64), counts)
    per_rank = counts.view(len(moe_layers), ep_size, -1).sum(-1)
    bal = balancedness(per_rank) if moe_layers else torch.zeros(0)
    return ExpertLoadSnapshot(
        layers=list(moe_layers),
        load=logical.tolist(),
        rank_load=per_rank.tolist(),
        balancedness=[round(float(b), 6) for b in bal],
    )
