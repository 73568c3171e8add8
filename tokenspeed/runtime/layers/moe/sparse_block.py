"""A sparse MoE block: router linear, top-k selection, experts; reports routing to the recorder."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenspeed.runtime.layers.linear import ReplicatedLinear
from tokenspeed.runtime.layers.moe.experts import TorchExperts
from tokenspeed.runtime.layers.moe.router import TopKRouter

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        layer_id: int,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.router = TopKRouter(top_k, renormalize)
        self.experts = TorchExperts(num_experts, hidden_size, intermediate_size)

    def forward(self, x: torch.Tensor, fb: ForwardBatch | None = None) -> torch.Tensor:
        topk_weights, topk_ids = self.router(self.gate(x))
        if fb is not None and fb.expert_recorder is not None:
            fb.expert_recorder.record(self.layer_id, topk_ids)
        return self.experts(x, topk_weights, topk_ids)
