"""The gated MLP of Llama-family models: down(silu(gate(x)) * up(x)), gate and up fused in one linear."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenspeed.runtime.layers.activation import SiluAndMul
from tokenspeed.runtime.layers.linear import MergedColumnLinear, RowLinear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedColumnLinear(hidden_size, [intermediate_size, intermediate_size], bias=bias)
        self.act_fn = SiluAndMul()
        self.down_proj = RowLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, fb: Any = None) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
