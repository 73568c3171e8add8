"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """silu(gate) * up for an input laid out [..., gate | up] (the output of a merged gate/up linear)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from tokenspeed.runtime.kernels.fused_ops import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def check_hidden_act(act: str, arch: str) -> None:
    if act != "silu":
        raise ValueError(f"{arch}: hidden_act {act!r} is not supported (only 'silu'); check config.json")
