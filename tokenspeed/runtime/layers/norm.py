"""RMSNorm, with the residual add fused into the same call (the shape a fused kernel replaces)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32 and the weight applied after casting back, as Hugging Face does, so
        # low-precision runs round the same way as the reference.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`forward(x)` returns norm(x); `forward(x, residual)` returns (norm(x + residual), x + residual)."""
        if x.is_cuda:
            # One fused launch on the GPU (kernels/fused_ops.py rounds exactly like `_norm`).
            from tokenspeed.runtime.kernels.fused_ops import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
