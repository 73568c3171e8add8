"""Sparse MoE over several ranks: experts sharded by expert (EP) or inside each expert (MoE TP).

Expert parallelism: the EP group's ranks hold the physical expert slots of an `ExpertLocation`, rank r
slots [r * S, (r + 1) * S); a slot holds one logical expert, hot experts may have several (redundant)
slots. Routing picks logical experts, `dispatch` turns each (token, k) choice into one physical slot, and
each rank computes the choices that landed on its own slots.

`--all2all-backend none` is the all-gather / reduce-scatter exchange. Our attention is tensor parallel
inside the same group, so every rank already holds every token of the step: the all-gather is the
identity and the combine (reduce-scatter, then the all-gather that re-replicates for the next layer) is
one all-reduce of the partial outputs. Token t is "owned" by rank t mod size, as it would be after a
reduce-scatter; the static dispatch uses the owner's rank, so every rank computes the same assignment
and each choice is computed exactly once.

MoE TP splits every expert's intermediate dimension instead; partial outputs are summed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenspeed.runtime.distributed.comm import all_reduce
from tokenspeed.runtime.distributed.groups import RankGroup
from tokenspeed.runtime.layers.linear import copy_weight
from tokenspeed.runtime.layers.quantization.fp8 import ExpertScales, narrow_for_shard, scale_rows
from tokenspeed.runtime.moe.backend import UsesMoeBackend, torch_experts
from tokenspeed.runtime.moe.dispatch import DispatchView, ExpertDispatch, localize
from tokenspeed.runtime.moe.expert_location import DISPATCH_ALGORITHMS, ExpertLocation
from tokenspeed.runtime.moe.experts import TorchExperts
from tokenspeed.runtime.moe.sparse_block import SparseMoeBlock, recorder_sink

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

ALL2ALL_BACKENDS = ("none",)


@dataclass
class ExpertParallelState:
    """What every MoE layer of one model shares: the placement, the dispatch rule and the EP group.

    The EPLB manager calls `set_location` between steps (after moving the weights): the host placement
    is replaced and the device dispatch tables are rewritten in place, so captured graphs stay valid.
    """

    location: ExpertLocation
    group: RankGroup
    dispatch_algorithm: str = "static"
    version: int = 0
    layers: dict[int, ExpertParallelExperts] = field(default_factory=dict)
    dispatch: ExpertDispatch = field(init=False)

    def __post_init__(self) -> None:
        if self.dispatch_algorithm not in DISPATCH_ALGORITHMS:
            raise ValueError(
                f"--ep-dispatch-algorithm {self.dispatch_algorithm!r} is not supported here; "
                f"choose one of {list(DISPATCH_ALGORITHMS)}"
            )
        if self.location.ep_size != self.group.size:
            raise ValueError(
                f"expert location is for EP size {self.location.ep_size}, the EP group has {self.group.size}"
            )
        # any placement of these slots gives an expert at most 1 + (physical - logical) replicas
        max_replicas = 1 + self.location.num_physical - self.location.num_logical
        self.dispatch = ExpertDispatch(self.location, max_replicas)

    def place_on(self, device: torch.device | str) -> None:
        """Put the dispatch tables on the model's device (start-up, before any forward)."""
        self.dispatch.to(device)

    def set_location(self, location: ExpertLocation) -> None:
        self.location = location
        self.dispatch.update(location)
        self.version += 1

    def dispatch_view(self, layer_id: int) -> DispatchView:
        return self.dispatch.view(
            layer_id, self.dispatch_algorithm, self.group.size, self.group.rank_in_group, self.slots_per_rank
        )

    @property
    def slots_per_rank(self) -> int:
        return self.location.slots_per_rank

    def local_slots(self, rank_in_group: int | None = None) -> range:
        r = self.group.rank_in_group if rank_in_group is None else rank_in_group
        return range(r * self.slots_per_rank, (r + 1) * self.slots_per_rank)


def _param_like(like: torch.Tensor, shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device), requires_grad=False)


class ExpertParallelExperts(nn.Module):
    """This rank's physical expert slots, stacked like `TorchExperts` (`w13` [S, 2I, H], `w2` [S, H, I])."""

    fp8_block: tuple[int, int] | None = None  # FP8 experts: the tile of their block-wise scales

    def __init__(self, full: TorchExperts, layer_id: int, state: ExpertParallelState):
        super().__init__()
        self.layer_id = layer_id
        self.state = state
        self.num_logical = full.num_experts
        self.hidden_size = full.hidden_size
        self.intermediate_size = full.intermediate_size
        if state.location.num_logical != self.num_logical:
            raise ValueError(
                f"expert location has {state.location.num_logical} logical experts, the model "
                f"{self.num_logical}; the --init-expert-location file belongs to another model"
            )
        s = state.slots_per_rank
        self.w13 = _param_like(full.w13, (s, *full.w13.shape[1:]))
        self.w2 = _param_like(full.w2, (s, *full.w2.shape[1:]))
        state.layers[layer_id] = self

    def local_logical(self) -> list[int]:
        """The logical expert each local slot holds under the current placement."""
        phy2log = self.state.location.placement.phy2log[self.layer_id]
        return [int(phy2log[slot]) for slot in self.state.local_slots()]

    # Checkpoint tensors are per logical expert; every local slot holding that expert takes a copy.
    def load_shard(self, param_name: str, shard_id: tuple[int, str], tensor: torch.Tensor, name: str) -> int:
        expert, part = shard_id
        if not 0 <= expert < self.num_logical:
            raise ValueError(
                f"checkpoint weight {name!r} names expert {expert} but the config has {self.num_logical}"
            )
        inter = self.intermediate_size
        param = getattr(self, param_name)  # w13 / w2, or an FP8 layer's w13_scale / w2_scale
        start = 0 if part == "gate" else inter
        rows = scale_rows(param_name, start, start + inter, self.fp8_block, name)
        written = 0
        for i, logical in enumerate(self.local_logical()):
            if logical != expert:
                continue
            dst = param[i] if part == "down" else param[i, rows[0] : rows[1]]
            written += copy_weight(dst, tensor, name)
        return written

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        """Stacked checkpoints (`experts.gate_up_proj` [E, ...]): take the rows of the local slots."""
        index = torch.tensor(self.local_logical(), dtype=torch.long)
        return copy_weight(getattr(self, param_name), tensor[index], name)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """The reference: `local` are this rank's slot indices, -1 for another rank's."""
        return torch_experts(x, self.w13, self.w2, topk_weights, local, ExpertScales.of(self))

    def extra_repr(self) -> str:
        return (
            f"logical={self.num_logical}, local_slots={self.state.slots_per_rank}, ep={self.state.group.size}"
        )


class TensorParallelExperts(nn.Module):
    """Every expert on every rank, each with 1/size of its intermediate dimension (MoE TP)."""

    fp8_block: tuple[int, int] | None = None  # FP8 experts: the tile of their block-wise scales

    def __init__(self, full: TorchExperts, group: RankGroup):
        super().__init__()
        from tokenspeed.runtime.distributed.tp_layers import split_size

        self.group = group
        self.num_experts = full.num_experts
        self.hidden_size = full.hidden_size
        self.full_intermediate = full.intermediate_size
        self.intermediate_size = split_size(full.intermediate_size, group.size, "MoE intermediate size")
        e, h, i = self.num_experts, full.hidden_size, self.intermediate_size
        self.w13 = _param_like(full.w13, (e, 2 * i, h))
        self.w2 = _param_like(full.w2, (e, h, i))

    def _slice(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        r, i = self.group.rank_in_group, self.intermediate_size
        return tensor.narrow(dim, r * i, i)

    def load_shard(self, param_name: str, shard_id: tuple[int, str], tensor: torch.Tensor, name: str) -> int:
        expert, part = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(
                f"checkpoint weight {name!r} names expert {expert} but the config has {self.num_experts}"
            )
        i, r = self.intermediate_size, self.group.rank_in_group
        param = getattr(self, param_name)  # w13 / w2, or an FP8 layer's w13_scale / w2_scale
        if part == "down":
            part_in = narrow_for_shard(tensor, param_name, 1, r * i, i, self.fp8_block, name)
            return copy_weight(param[expert], part_in, name)
        start = 0 if part == "gate" else i
        lo, hi = scale_rows(param_name, start, start + i, self.fp8_block, name)
        part_out = narrow_for_shard(tensor, param_name, 0, r * i, i, self.fp8_block, name)
        return copy_weight(param[expert, lo:hi], part_out, name)

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        if param_name == "w13":
            full_i = self.full_intermediate
            gate, up = tensor[:, :full_i], tensor[:, full_i:]
            part = torch.cat([self._slice(gate, 1), self._slice(up, 1)], dim=1)
            return copy_weight(self.w13, part, name)
        return copy_weight(self.w2, self._slice(tensor, 2), name)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return torch_experts(x, self.w13, self.w2, topk_weights, topk_ids, ExpertScales.of(self))


class ParallelMoeBlock(UsesMoeBackend):
    """A `SparseMoeBlock` with its experts sharded over `group`; partial outputs are summed."""

    def __init__(self, full: SparseMoeBlock, group: RankGroup, state: ExpertParallelState | None = None):
        super().__init__()
        self.layer_id = full.layer_id
        self.gate = full.gate
        self.router = full.router
        self.backend = full.backend
        self.group = group
        self.state = state
        if state is not None:
            self.experts = ExpertParallelExperts(full.experts, full.layer_id, state)
        else:
            self.experts = TensorParallelExperts(full.experts, group)

    def use_moe_backend(self, backend, device: torch.device) -> None:
        super().use_moe_backend(backend, device)
        if self.state is not None:
            self.state.place_on(device)  # the dispatch tables the routing reads, once for all layers

    def routed(self, x: torch.Tensor, logits: torch.Tensor, fb: ForwardBatch | None) -> torch.Tensor:
        # token t is owned by rank t mod size (see the module docstring); every rank agrees
        view = self.state.dispatch_view(self.layer_id) if self.state is not None else None
        rec, counts = recorder_sink(fb, self.layer_id)
        host_record = rec is not None and counts is None
        # a recorder taking ids on the host gets physical slots: localize after it has seen them
        route_view = replace(view, localize=False) if host_record and view is not None else view
        mask = fb.out_cache_loc if counts is not None else None
        weights, ids = self.backend.route(
            logits, self.router.top_k, self.router.renormalize, route_view, counts, mask
        )
        if host_record:
            rec.record(self.layer_id, ids)
            if view is not None:
                ids = localize(view, ids)
        return all_reduce(self.backend.experts(self.experts, x, weights, ids), self.group)
