"""Rotary position embedding with a cos/sin cache indexed by absolute positions.

Positions come from the ForwardBatch (one per new token), so prefill chunks and decodes of different
requests rotate correctly in one call. The cache is a non-persistent float32 buffer; after the model is
materialised from the meta device the loader calls `init_buffers()` to fill it on the target device.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """`rope_theta` and scaling of a config, from the newer `rope_parameters` or the older fields."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    legacy = getattr(hf_config, "rope_scaling", None)
    if not params and legacy:
        params = dict(legacy)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def compute_inv_freq(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = params["rope_type"]
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_len = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(
        f"rope type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)}); "
        "check rope_scaling / rope_parameters in config.json or --hf-overrides"
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) rotary embedding over the whole head dimension."""

    def __init__(self, head_dim: int, max_position: int, params: dict[str, Any]):
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.params = dict(params)
        # Fail at construction on an unsupported rope type. Computed on the CPU: the model is built under
        # the meta device, where this division goes through torch's reference ops, whose first use imports
        # torch._dynamo (2.4 s of a CPU server's start-up).
        with torch.device("cpu"):
            compute_inv_freq(head_dim, self.params)
        self.register_buffer("cos_sin_cache", torch.empty(max_position, 2 * head_dim), persistent=False)

    def init_buffers(self) -> None:
        device = self.cos_sin_cache.device
        inv_freq = compute_inv_freq(self.head_dim, self.params)
        t = torch.arange(self.max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos_sin_cache = torch.cat((emb.cos(), emb.sin()), dim=-1).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[T, 2 * head_dim] cos|sin rows of `positions` in `dtype`, gathered once per step for all layers.

        The table is float32; casting the gathered rows to the activation dtype matches the reference,
        which computes cos/sin in float32 and casts them before rotating.
        """
        return self.cos_sin_cache[positions].to(dtype)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary(self.cos_sin(positions, q.dtype), q, k)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_position={self.max_position}, type={self.params['rope_type']}"


def apply_rotary(
    cos_sin: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, heads, head_dim] and k [T, kv_heads, head_dim] by rows of `RotaryEmbedding.cos_sin`."""
    if q.is_cuda:
        from tokenspeed.runtime.kernels.fused_ops import apply_rope

        return apply_rope(cos_sin, q, k)
    cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
