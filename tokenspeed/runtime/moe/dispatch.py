"""The replica tables the MoE layers read on the device, kept in persistent buffers.

`ExpertLocation` (expert_location.py) is the placement on the host. A forward must not copy it to the
device (a CUDA graph captures a copy's source pointer once), so `ExpertDispatch` keeps one device copy
of every layer's `log2phy` (padded to the most replicas any placement can give: 1 + redundant slots) and
`logcnt`, and an EPLB rebalance rewrites them in place with `update`: the tensors captured graphs read
stay the same, only their contents change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenspeed.runtime.moe.expert_location import ExpertLocation


@dataclass(frozen=True)
class DispatchView:
    """One layer's replica tables on the device (views into `ExpertDispatch`'s buffers)."""

    log2phy: torch.Tensor  # [E, R] int32 physical slots of each logical expert, -1 past its replicas
    logcnt: torch.Tensor  # [E] int32 replicas of each logical expert
    algorithm: str  # "static" | "dynamic"
    ep_size: int
    slot_lo: int  # first physical slot of this rank
    slots_local: int  # slots of this rank; slots outside [slot_lo, slot_lo + slots_local) become -1
    localize: bool  # False when this rank holds every slot (ids stay physical)


class ExpertDispatch:
    def __init__(self, location: ExpertLocation, max_replicas: int, device: torch.device | str = "cpu"):
        layers, num_logical = location.placement.logcnt.shape
        self.max_replicas = max_replicas
        self.log2phy = torch.full((layers, num_logical, max_replicas), -1, dtype=torch.int32, device=device)
        self.logcnt = torch.ones((layers, num_logical), dtype=torch.int32, device=device)
        self.update(location)

    @property
    def device(self) -> torch.device:
        return self.log2phy.device

    def to(self, device: torch.device | str) -> None:
        """Move the buffers (at start-up, before any forward: captured graphs would keep the old ones)."""
        if self.log2phy.device == torch.device(device):
            return
        self.log2phy = self.log2phy.to(device)
        self.logcnt = self.logcnt.to(device)

    def update(self, location: ExpertLocation) -> None:
        """Rewrite the tables for `location`, in place (stream-ordered: no step sees half of them)."""
        p = location.placement
        reps = p.log2phy.shape[-1]
        if reps > self.max_replicas:
            raise RuntimeError(
                f"placement gives an expert {reps} replicas, the dispatch tables hold {self.max_replicas}"
            )
        table = torch.full(self.log2phy.shape, -1, dtype=torch.int32)
        table[:, :, :reps] = p.log2phy.to(torch.int32)
        self.log2phy.copy_(table.to(self.device, non_blocking=False))
        self.logcnt.copy_(p.logcnt.to(torch.int32).to(self.device))

    def view(
        self, layer_id: int, algorithm: str, ep_size: int, rank_in_group: int, slots_per_rank: int
    ) -> DispatchView:
        return DispatchView(
            log2phy=self.log2phy[layer_id],
            logcnt=self.logcnt[layer_id],
            algorithm=algorithm,
            ep_size=ep_size,
            slot_lo=rank_in_group * slots_per_rank,
            slots_local=slots_per_rank,
            localize=ep_size > 1,
        )


def torch_dispatch(view: DispatchView, topk_logical: torch.Tensor) -> torch.Tensor:
    """Physical slot of every routed choice (the reference of the fused router's dispatch)."""
    ids = topk_logical.long()
    cnt = view.logcnt.long()[ids]
    token = torch.arange(ids.shape[0], device=ids.device).unsqueeze(-1)
    sel = token % view.ep_size if view.algorithm == "static" else token
    return view.log2phy.long()[ids, sel % cnt]


def localize(view: DispatchView, physical: torch.Tensor) -> torch.Tensor:
    """Physical slots -> this rank's local slot index, -1 for another rank's."""
    if not view.localize:
        return physical
    local = physical - view.slot_lo
    return torch.where((local >= 0) & (local < view.slots_local), local, torch.full_like(local, -1))
