"""RoPE and the KV-cache write in one launch: the step between the QKV projection and attention.

Unfused, a layer runs the rotary kernel (q and k rotated into new tensors) and then the K/V store (rotated
k and v copied into the pool at `out_cache_loc`): two launches per layer, 64 per decode step of a 32-layer
model, each a few microseconds of a step that reads the weights in about 3.5 ms. Here one program per
(token, head) rotates a query head, or rotates a key head and writes it to the pool together with the value
head. q, k and v are read through their strides, so the views the QKV split produces need no copy. The
rotation is `fused_ops.rotate_qk_head`, the one `fused_ops.apply_rope` runs (rounded as the PyTorch reference
rounds), so outputs are bit-identical to the unfused pair.

Qwen3's per-head RMSNorm of q and k (`q_norm`, `k_norm`) runs in the same program when the layer passes
its weights: two more launches a layer saved (96 a step of a 48-layer Qwen3-MoE, where a one-token step
reads its weights in about 1.4 ms). The norm rounds where the RMSNorm kernel rounds; its sum of squares
adds the two halves' sums, so bf16 results agree with the unfused norm within one rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import pdl
from tokenspeed.runtime.kernels.fused_ops import (
    load_halves,
    rms_norm_halves,
    rope_launch,
    rope_operands,
    rotate_halves,
    rotate_qk_head,
    store_halves,
)


@triton.jit
def _rope_store_kernel(
    Q, K, V, QO, KO, K_buf, V_buf, LOC, CS, QW, KW, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_kbt, stride_kbh, stride_vbt, stride_vbh,
    stride_cs,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, HAS_NORM: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # Under PDL (kernels/pdl.py) decode attention may be scheduled while this runs; q, k and v are the
    # qkv projection's output.
    pdl.release(PDL)
    pdl.wait(PDL)
    if HAS_NORM:
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        if h < NUM_Q_HEADS:
            x1, x2 = load_halves(Q + t * stride_qt + h * stride_qh, HALF, BLOCK)
            x1, x2 = rms_norm_halves(x1, x2, QW, eps, HALF, BLOCK)
        else:
            x1, x2 = load_halves(K + t * stride_kt + (h - NUM_Q_HEADS) * stride_kh, HALF, BLOCK)
            x1, x2 = rms_norm_halves(x1, x2, KW, eps, HALF, BLOCK)
        o1, o2 = rotate_halves(x1, x2, CS + t * stride_cs, HALF, BLOCK)
    else:
        t, h, o1, o2 = rotate_qk_head(
            Q, K, CS, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs, NUM_Q_HEADS, HALF, BLOCK
        )
    if h < NUM_Q_HEADS:
        store_halves(QO + t * stride_qot + h * stride_qoh, o1, o2, HALF, BLOCK)
    else:
        kh = h - NUM_Q_HEADS
        store_halves(KO + t * stride_kot + kh * stride_koh, o1, o2, HALF, BLOCK)
        loc = tl.load(LOC + t).to(tl.int64)
        store_halves(K_buf + loc * stride_kbt + kh * stride_kbh, o1, o2, HALF, BLOCK)
        vsrc = V + t * stride_vt + kh * stride_vh
        offs = tl.arange(0, BLOCK)
        mask = offs < HALF
        v1 = tl.load(vsrc + offs, mask=mask, other=0.0)
        v2 = tl.load(vsrc + HALF + offs, mask=mask, other=0.0)
        store_halves(V_buf + loc * stride_vbt + kh * stride_vbh, v1, v2, HALF, BLOCK)


def rope_store_kv(
    cos_sin: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    loc: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, KVH, D] by cos|sin rows [T, 2D]; write rotated k and v [T, KVH, D] to
    k_buf/v_buf [slots, KVH, D] at slots `loc` [T]. Returns the rotated (q, k), contiguous.
    `qk_norm` = (q weight [D], k weight [D], eps): RMSNorm each head of q and k before rotating (the
    weights in q's dtype; `qk_norm_fusable` says whether a layer's are).

    The head dimension of q, k and v must be contiguous (stride 1); token and head strides are free.
    """
    cos_sin, q, k, qo, ko = rope_operands(cos_sin, q, k)
    if v.stride(-1) != 1:
        v = v.contiguous()
    if q.shape[0] == 0:
        return qo, ko
    grid, consts = rope_launch(q, k)
    qw, kw, eps = qk_norm if qk_norm is not None else (q, k, 0.0)  # unread without HAS_NORM
    _rope_store_kernel[grid](
        q, k, v, qo, ko, k_buf, v_buf, loc, cos_sin, qw, kw, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        cos_sin.stride(0),
        HAS_NORM=qk_norm is not None,
        **consts,
        **pdl.launch_kwargs(q.device),
    )  # fmt: skip
    return qo, ko


def qk_norm_fusable(q: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor) -> bool:
    """Whether `rope_store_kv` can apply these norms: weights of one head's size in q's dtype (a weight in
    another dtype would promote the unfused norm's output, which the fused kernel does not)."""
    d = q.shape[-1]
    return all(
        w.dtype == q.dtype and w.dim() == 1 and w.shape[0] == d and w.is_contiguous()
        for w in (q_weight, k_weight)
    )
