"""The attention layer of a model: reshapes to heads and hands off to the step's backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float, layer_id: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """q [T, heads*head_dim], k/v [T, kv_heads*head_dim] -> [T, heads*head_dim]."""
        t = q.shape[0]
        out = fb.attn_backend.forward(
            q.view(t, self.num_heads, self.head_dim),
            k.view(t, self.num_kv_heads, self.head_dim),
            v.view(t, self.num_kv_heads, self.head_dim),
            self.layer_id,
            fb,
            self.scaling,
        )
        return out.reshape(t, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
