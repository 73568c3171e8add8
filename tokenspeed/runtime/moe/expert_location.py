"""Where experts live: the physical -> logical map of every MoE layer and how tokens pick a replica.

With E logical experts, R redundant slots and an EP group of size P, there are E + R physical slots,
(E + R) / P per rank; rank r holds slots [r * (E+R)/P, (r+1) * (E+R)/P). The router chooses logical
experts; `dispatch` turns them into physical slots:
- static: every token of a logical expert goes to one fixed replica, the one nearest the caller's rank,
  so the choice never changes between steps (graph-friendly);
- dynamic: tokens spread over all replicas of their expert (token index modulo replica count), which
  splits a hot expert's load evenly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenspeed.runtime.moe.eplb_algorithm import ExpertPlacement, rebalance_experts

DISPATCH_ALGORITHMS = ("static", "dynamic")


@dataclass
class ExpertLocation:
    placement: ExpertPlacement
    ep_size: int
    num_logical: int

    @property
    def num_physical(self) -> int:
        return self.placement.num_physical

    @property
    def slots_per_rank(self) -> int:
        return self.num_physical // self.ep_size

    @classmethod
    def trivial(cls, num_layers: int, num_logical: int, num_redundant: int, ep_size: int) -> ExpertLocation:
        """Identity placement; the redundant slots replicate experts round-robin."""
        num_physical = num_logical + num_redundant
        if num_physical % ep_size:
            raise ValueError(
                f"{num_logical} experts + {num_redundant} redundant = {num_physical} slots do not divide over "
                f"EP size {ep_size}; adjust --ep-num-redundant-experts"
            )
        uniform = torch.ones((num_layers, num_logical))
        if num_redundant == 0:
            phy2log = torch.arange(num_logical).repeat(num_layers, 1)
            log2phy = phy2log.clone().unsqueeze(-1)
            logcnt = torch.ones((num_layers, num_logical), dtype=torch.int64)
            return cls(ExpertPlacement(phy2log, log2phy, logcnt), ep_size, num_logical)
        return cls(
            rebalance_experts(uniform, num_physical, ep_size, algorithm="deepseek"), ep_size, num_logical
        )

    @classmethod
    def from_counts(
        cls,
        counts: torch.Tensor,
        num_redundant: int,
        ep_size: int,
        num_nodes: int = 1,
        algorithm: str = "auto",
    ) -> ExpertLocation:
        layers, num_logical = counts.shape
        placement = rebalance_experts(
            counts,
            num_logical + num_redundant,
            ep_size,
            num_groups=1,
            num_nodes=num_nodes,
            algorithm=algorithm,
        )
        return cls(placement, ep_size, num_logical)

    @classmethod
    def from_init_arg(
        cls,
        value: str,
        num_layers: int,
        num_logical: int,
        num_redundant: int,
        ep_size: int,
        algorithm: str = "auto",
    ) -> ExpertLocation:
        """--init-expert-location: "trivial", or a .json/.pt file holding `physical_to_logical_map`
        [layers, physical] or `logical_count` [layers, logical]."""
        if value in (None, "", "trivial"):
            return cls.trivial(num_layers, num_logical, num_redundant, ep_size)
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"--init-expert-location {value!r}: not 'trivial' and no such file")
        data = json.loads(path.read_text()) if path.suffix == ".json" else torch.load(path, weights_only=True)
        if "physical_to_logical_map" in data:
            phy2log = torch.as_tensor(data["physical_to_logical_map"], dtype=torch.int64)
            return cls.from_phy2log(phy2log, num_logical, ep_size)
        if "logical_count" in data:
            counts = torch.as_tensor(data["logical_count"], dtype=torch.float32)
            if counts.shape != (num_layers, num_logical):
                raise ValueError(
                    f"--init-expert-location: logical_count has shape {tuple(counts.shape)}, "
                    f"the model needs ({num_layers}, {num_logical})"
                )
            return cls.from_counts(counts, num_redundant, ep_size, algorithm=algorithm)
        raise ValueError("--init-expert-location file must hold 'physical_to_logical_map' or 'logical_count'")

    @classmethod
    def from_phy2log(cls, phy2log: torch.Tensor, num_logical: int, ep_size: int) -> ExpertLocation:
        layers, num_physical = phy2log.shape
        if num_physical % ep_size:
            raise ValueError(
                f"physical_to_logical_map has {num_physical} slots, not a multiple of EP size {ep_size}"
            )
        logcnt = torch.zeros((layers, num_logical), dtype=torch.int64)
        logcnt.scatter_add_(1, phy2log, torch.ones_like(phy2log))
        if (logcnt == 0).any():
            raise ValueError("physical_to_logical_map leaves some logical expert without a slot")
        max_rep = int(logcnt.max())
        log2phy = torch.full((layers, num_logical, max_rep), -1, dtype=torch.int64)
        for layer in range(layers):
            seen = [0] * num_logical
            for slot, e in enumerate(phy2log[layer].tolist()):
                log2phy[layer, e, seen[e]] = slot
                seen[e] += 1
        return cls(ExpertPlacement(phy2log, log2phy, logcnt), ep_size, num_logical)

    def dispatch(
        self, layer_id: int, topk_logical: torch.Tensor, algorithm: str, ep_rank: int = 0
    ) -> torch.Tensor:
        """Physical slot for every routed (token, k) choice, same shape as `topk_logical`."""
        log2phy = self.placement.log2phy[layer_id].to(topk_logical.device)
        cnt = self.placement.logcnt[layer_id].to(topk_logical.device)[topk_logical]
        if algorithm == "dynamic":
            token_idx = torch.arange(topk_logical.shape[0], device=topk_logical.device).unsqueeze(-1)
            pick = token_idx % cnt
        elif algorithm == "static":
            # the replica whose rank is nearest (cyclically at or after) this rank, fixed per expert
            pick = ep_rank % cnt
        else:
            raise ValueError(
                f"--ep-dispatch-algorithm {algorithm!r}: choose one of {list(DISPATCH_ALGORITHMS)}"
            )
        return log2phy[topk_logical, pick]
