"""Top-k expert selection from router logits: the block's routing settings and the reference forward.

MoE blocks route through their backend (`backend.py`: the fused kernel on CUDA); this module's forward is
the PyTorch reference the backends are checked against.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenspeed.runtime.moe.backend import torch_topk


class TopKRouter(nn.Module):
    def __init__(self, top_k: int, renormalize: bool):
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize

    def forward(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, E] logits -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64)."""
        return torch_topk(router_logits, self.top_k, self.renormalize)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, renormalize={self.renormalize}"
