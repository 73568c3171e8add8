"""The attention layer of a model: reshapes to heads, rotates q and k, and hands off to the step's backend.

Given the step's cos|sin rows, the layer applies RoPE itself: on a backend that supports it (the CUDA
backends) the rotation and the write of the new K/V into the pool are one kernel
(`kernels/rope_store.py`), and the backend then only attends; elsewhere q and k are rotated
(`layers/rotary.apply_rotary`) and the backend stores K/V as part of `forward`. A layer with per-head q/k
norms (Qwen3) hands them over too: the fused kernel applies them before rotating, elsewhere they run first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenspeed.runtime.layers.rotary import apply_rotary

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch
    from tokenspeed.runtime.layers.norm import RMSNorm


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float, layer_id: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        fb: ForwardBatch,
        cos_sin: torch.Tensor | None = None,
        qk_norm: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> torch.Tensor:
        """q [T, heads*head_dim], k/v [T, kv_heads*head_dim] (or already split into heads) ->
        [T, heads*head_dim]. With `cos_sin` ([T, 2*head_dim], `RotaryEmbedding.cos_sin`) q and k are
        rotated here first; without it they arrive rotated. `qk_norm`: (q_norm, k_norm), each head's
        RMSNorm, applied before the rotation."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        backend = fb.attn_backend
        # One kernel rotates q and k and writes the new K/V (an FP8 pool is written by its own quantizing
        # store, `KVPool.set_kv`, instead); it also applies the q/k norms when their weights suit it.
        fused = (
            cos_sin is not None
            and q.is_cuda
            and getattr(backend, "supports_fused_rope_store", False)
            and not fb.kv_pool.quantized
        )
        if fused:
            from tokenspeed.runtime.kernels.rope_store import (  # Triton: CUDA only
                qk_norm_fusable,
                rope_store_kv,
            )
        norms = None
        if qk_norm is not None:
            q_norm, k_norm = qk_norm
            if fused and q_norm.eps == k_norm.eps and qk_norm_fusable(q, q_norm.weight, k_norm.weight):
                norms = (q_norm.weight, k_norm.weight, q_norm.eps)
            else:
                q, k = q_norm(q), k_norm(k)
        if fused:
            k_buf, v_buf = fb.kv_pool.get_kv(self.layer_id)
            q, k = rope_store_kv(cos_sin, q, k, v, k_buf, v_buf, fb.out_cache_loc, norms)
        elif cos_sin is not None:
            q, k = apply_rotary(cos_sin, q, k)
        out = backend.forward(q, k, v, self.layer_id, fb, self.scaling, kv_stored=fused)
        return out.reshape(t, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
