"""Top-k expert selection from router logits."""

from __future__ import annotations

import torch
from torch import nn


class TopKRouter(nn.Module):
    def __init__(self, top_k: int, renormalize: bool):
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize

    def forward(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, E] logits -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64)."""
        # Softmax in float32 before top-k, then (optionally) renormalise the k kept probabilities.
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(router_logits.dtype), ids

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, renormalize={self.renormalize}"
