"""Reference experts in plain PyTorch: each expert a gated MLP, tokens gathered per expert.

Weights are stacked per layer: `w13` [E, 2 * I, H] (gate rows then up rows) and `w2` [E, H, I], the layout
fused MoE kernels and expert-parallel sharding expect. The block's backend (`backend.py`) runs them;
`forward` here is the reference loop. Checkpoints may store experts one by one
(`experts.{e}.gate_proj.weight`) or already stacked (`experts.gate_up_proj`); both load.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenspeed.runtime.layers.linear import copy_weight
from tokenspeed.runtime.layers.quantization.fp8 import ExpertScales, scale_rows


class TorchExperts(nn.Module):
    fp8_block: tuple[int, int] | None = None  # FP8 experts: the tile of their block-wise scales

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.w13 = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False)

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        return copy_weight(getattr(self, param_name), tensor, name)

    def load_shard(self, param_name: str, shard_id: tuple[int, str], tensor: torch.Tensor, name: str) -> int:
        """shard_id = (expert, "gate" | "up" | "down"); `param_name` may be an FP8 scale (`w13_scale`)."""
        expert, part = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(
                f"checkpoint weight {name!r} names expert {expert} but the config has {self.num_experts}"
            )
        inter = self.intermediate_size
        param = getattr(self, param_name)
        if part == "down":
            return copy_weight(param[expert], tensor, name)
        start = 0 if part == "gate" else inter
        start, end = scale_rows(param_name, start, start + inter, self.fp8_block, name)
        return copy_weight(param[expert, start:end], tensor, name)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """The reference computation (MoE blocks call their backend instead; tests compare against this)."""
        from tokenspeed.runtime.moe.backend import torch_experts

        return torch_experts(x, self.w13, self.w2, topk_weights, topk_ids, ExpertScales.of(self))

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}"
