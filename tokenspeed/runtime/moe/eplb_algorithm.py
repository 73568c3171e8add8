"""Expert-parallel load balancing: where each logical expert and its replicas live.

Input is the measured load `weight[layer, logical_expert]` (tokens routed over a window). Output is a
placement of `num_physical` expert slots (num_logical + redundant) over `num_ranks` EP ranks, each rank
holding `num_physical / num_ranks` slots:

    phy2log[layer, physical_slot] -> logical expert held in that slot
    log2phy[layer, logical, k]    -> k-th physical slot holding the logical expert (-1 pads unused k)
    logcnt[layer, logical]        -> number of replicas of the logical expert

Two algorithms, as in DeepSeek's EPLB:
- `deepseek`: replicate the heaviest experts (each replica takes an equal share of its expert's load),
  then pack the physical experts onto ranks with balanced packing (heaviest first, onto the lightest rank
  that still has room).
- `deepseek_hierarchical`: when expert groups divide evenly over nodes, first pack whole groups onto
  nodes (keeping a group's experts on one node keeps group-limited routing node-local), then replicate
  and pack within each node.
`auto` picks hierarchical when the groups divide over nodes and there is more than one node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALGORITHMS = ("auto", "deepseek", "deepseek_hierarchical")


@dataclass(frozen=True)
class ExpertPlacement:
    phy2log: torch.Tensor  # [layers, num_physical] int64
    log2phy: torch.Tensor  # [layers, num_logical, max_replicas] int64, -1 padded
    logcnt: torch.Tensor  # [layers, num_logical] int64

    @property
    def num_physical(self) -> int:
        return int(self.phy2log.shape[1])


def balanced_packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack n items per row into num_packs packs of n/num_packs items, balancing the summed weight.

    Returns (pack_index, rank_in_pack), both [rows, n].
    """
    rows, n = weight.shape
    if n % num_packs:
        raise ValueError(f"{n} items cannot be packed evenly into {num_packs} packs")
    per_pack = n // num_packs
    pack_index = torch.empty((rows, n), dtype=torch.int64)
    rank_in_pack = torch.empty((rows, n), dtype=torch.int64)
    if per_pack == 1:
        pack_index[:] = torch.arange(n)
        rank_in_pack.zero_()
        return pack_index, rank_in_pack
    order = weight.float().sort(dim=-1, descending=True).indices
    w = weight.float().tolist()
    for r in range(rows):
        loads = [0.0] * num_packs
        counts = [0] * num_packs
        for item in order[r].tolist():
            pack = min((p for p in range(num_packs) if counts[p] < per_pack), key=loads.__getitem__)
            pack_index[r, item] = pack
            rank_in_pack[r, item] = counts[pack]
            loads[pack] += w[r][item]
            counts[pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(
    weight: torch.Tensor, num_physical: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Give the extra slots, one at a time, to the expert with the highest load per replica.

    Returns (phy2log [rows, num_physical], replica_rank [rows, num_physical], logcnt [rows, num_logical]).
    """
    rows, num_logical = weight.shape
    if num_physical < num_logical:
        raise ValueError(f"{num_physical} physical slots cannot hold {num_logical} logical experts")
    phy2log = torch.arange(num_physical, dtype=torch.int64).repeat(rows, 1)
    replica_rank = torch.zeros((rows, num_physical), dtype=torch.int64)
    logcnt = torch.ones((rows, num_logical), dtype=torch.int64)
    row_ids = torch.arange(rows)
    w = weight.float()
    for slot in range(num_logical, num_physical):
        heaviest = (w / logcnt).argmax(dim=-1)
        phy2log[:, slot] = heaviest
        replica_rank[:, slot] = logcnt[row_ids, heaviest]
        logcnt[row_ids, heaviest] += 1
    return phy2log, replica_rank, logcnt


def _invert(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv.scatter_(1, perm, torch.arange(perm.size(1), dtype=torch.int64).expand(perm.shape).contiguous())
    return inv


def _hierarchical(
    weight: torch.Tensor, num_physical: int, num_groups: int, num_nodes: int, num_ranks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layers, num_logical = weight.shape
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    ranks_per_node = num_ranks // num_nodes
    phy_per_node = num_physical // num_nodes

    # 1. whole groups onto nodes
    group_load = weight.unflatten(-1, (num_groups, group_size)).sum(-1)
    group_pack, group_rank = balanced_packing(group_load, num_nodes)
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size).unsqueeze(-1)
        + torch.arange(group_size, dtype=torch.int64)
    ).flatten(-2)
    mlog2log = _invert(log2mlog)

    # 2. replicas within each node: [layers * nodes, logical_per_node]
    node_weight = weight.gather(-1, mlog2log).view(-1, num_logical // num_nodes)
    phy2mlog, phyrank, mlogcnt = replicate_experts(node_weight, phy_per_node)

    # 3. physical experts onto the node's ranks
    tokens_per_phy = (node_weight / mlogcnt).gather(-1, phy2mlog)
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy, ranks_per_node)
    phy2pphy = pack_index * (phy_per_node // ranks_per_node) + rank_in_pack
    pphy2phy = _invert(phy2pphy)

    pphy2mlog = phy2mlog.gather(-1, pphy2phy)
    offsets = torch.arange(0, num_logical, num_logical // num_nodes, dtype=torch.int64).view(1, -1, 1)
    pphy2mlog = (pphy2mlog.view(layers, num_nodes, -1) + offsets).flatten(-2)
    pphy2log = mlog2log.gather(-1, pphy2mlog)
    pphyrank = phyrank.gather(-1, pphy2phy).view(layers, -1)
    logcnt = mlogcnt.view(layers, -1).gather(-1, log2mlog)
    return pphy2log, pphyrank, logcnt


def resolve_algorithm(name: str, num_groups: int, num_nodes: int) -> str:
    if name not in ALGORITHMS:
        raise ValueError(f"--eplb-algorithm {name!r} is not known; choose one of {list(ALGORITHMS)}")
    if name != "auto":
        return name
    if num_nodes > 1 and num_groups % num_nodes == 0:
        return "deepseek_hierarchical"
    return "deepseek"


def rebalance_experts(
    weight: torch.Tensor,
    num_physical: int,
    num_ranks: int,
    num_groups: int = 1,
    num_nodes: int = 1,
    algorithm: str = "auto",
) -> ExpertPlacement:
    """Place `num_physical` expert slots over `num_ranks` ranks for the load `weight[layers, logical]`."""
    layers, num_logical = weight.shape
    if num_physical % num_ranks:
        raise ValueError(
            f"{num_physical} physical experts do not divide over {num_ranks} EP ranks; "
            "set --ep-num-redundant-experts so that experts + redundant is a multiple of the EP size"
        )
    if num_ranks % num_nodes:
        raise ValueError(f"{num_ranks} EP ranks do not divide over {num_nodes} nodes")
    algo = resolve_algorithm(algorithm, num_groups, num_nodes)
    weight = weight.float().cpu()
    if algo == "deepseek_hierarchical":
        if num_logical % num_groups or num_groups % num_nodes:
            raise ValueError(
                f"deepseek_hierarchical needs expert groups ({num_groups}) to divide the experts "
                f"({num_logical}) and the nodes ({num_nodes}) to divide the groups; use --eplb-algorithm deepseek"
            )
        phy2log, phyrank, logcnt = _hierarchical(weight, num_physical, num_groups, num_nodes, num_ranks)
    else:
        phy2log, phyrank, logcnt = _hierarchical(weight, num_physical, 1, 1, num_ranks)
    max_replicas = int(logcnt.max())
    log2phy = torch.full((layers, num_logical, max_replicas), -1, dtype=torch.int64)
    slots = torch.arange(num_physical, dtype=torch.int64).expand(layers, -1)
    log2phy.view(layers, -1).scatter_(-1, phy2log * max_replicas + phyrank, slots.contiguous())
    return ExpertPlacement(phy2log=phy2log, log2phy=log2phy, logcnt=logcnt)


def rank_loads(weight: torch.Tensor, placement: ExpertPlacement, num_ranks: int) -> torch.Tensor:
    """Expected tokens per EP rank [layers, ranks] when each expert's load is split evenly over replicas."""
    per_replica = weight.float() / placement.logcnt
    phy_load = per_replica.gather(-1, placement.phy2log)
    return phy_load.view(phy_load.shape[0], num_ranks, -1).sum(-1)


def balancedness(loads: torch.Tensor) -> torch.Tensor:
    """Mean over max load per rank, per layer: 1.0 is perfect balance. Layers with no load count as 1."""
    mx = loads.float().max(dim=-1).values
    mean = loads.float().mean(dim=-1)
    return torch.where(mx > 0, mean / mx.clamp(min=1e-12), torch.ones_like(mx))


def worse_layers(
    weight: torch.Tensor, old: ExpertPlacement, new: ExpertPlacement, num_ranks: int
) -> torch.Tensor:
    """Layers [layers] where `new` balances the load `weight` worse than `old` does. The greedy packing
    is not optimal, so for some loads the placement already in use is the better one."""
    old_bal = balancedness(rank_loads(weight, old, num_ranks))
    new_bal = balancedness(rank_loads(weight, new, num_ranks))
    return new_bal < old_bal - 1e-6
