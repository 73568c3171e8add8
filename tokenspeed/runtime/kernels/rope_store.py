"""RoPE and the KV-cache write in one launch: the step between the QKV projection and attention.

Unfused, a layer runs the rotary kernel (q and k rotated into new tensors) and then the K/V store (rotated
k and v copied into the pool at `out_cache_loc`): two launches per layer, 64 per decode step of a 32-layer
model, each a few microseconds of a step that reads the weights in about 3.5 ms. Here one program per
(token, head) rotates a query head, or rotates a key head and writes it to the pool together with the value
head. q, k and v are read through their strides, so the views the QKV split produces need no copy. The
rounding is the one `fused_ops.apply_rope` uses (and so the PyTorch reference's), so outputs are
bit-identical to the unfused pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store_kernel(
    Q,
    K,
    V,
    QO,
    KO,
    K_buf,
    V_buf,
    LOC,
    CS,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_kbt,
    stride_kbh,
    stride_vbt,
    stride_vbh,
    stride_cs,
    NUM_Q_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    cs = CS + t * stride_cs
    cos1 = tl.load(cs + offs, mask=mask, other=0.0)
    cos2 = tl.load(cs + HALF + offs, mask=mask, other=0.0)
    sin1 = tl.load(cs + 2 * HALF + offs, mask=mask, other=0.0)
    sin2 = tl.load(cs + 3 * HALF + offs, mask=mask, other=0.0)
    if h < NUM_Q_HEADS:
        src = Q + t * stride_qt + h * stride_qh
    else:
        src = K + t * stride_kt + (h - NUM_Q_HEADS) * stride_kh
    x1 = tl.load(src + offs, mask=mask, other=0.0)
    x2 = tl.load(src + HALF + offs, mask=mask, other=0.0)
    dt = x1.dtype
    # q * cos + rotate_half(q) * sin, rotate_half(q) = [-x2, x1], rounded where the reference rounds.
    o1 = ((x1 * cos1).to(dt) + (-x2 * sin1).to(dt)).to(dt)
    o2 = ((x2 * cos2).to(dt) + (x1 * sin2).to(dt)).to(dt)
    if h < NUM_Q_HEADS:
        dst = QO + t * stride_qot + h * stride_qoh
        tl.store(dst + offs, o1, mask=mask)
        tl.store(dst + HALF + offs, o2, mask=mask)
    else:
        kh = h - NUM_Q_HEADS
        dst = KO + t * stride_kot + kh * stride_koh
        tl.store(dst + offs, o1, mask=mask)
        tl.store(dst + HALF + offs, o2, mask=mask)
        loc = tl.load(LOC + t).to(tl.int64)
        kb = K_buf + loc * stride_kbt + kh * stride_kbh
        kdt = K_buf.dtype.element_ty
        tl.store(kb + offs, o1.to(kdt), mask=mask)
        tl.store(kb + HALF + offs, o2.to(kdt), mask=mask)
        vsrc = V + t * stride_vt + kh * stride_vh
        vb = V_buf + loc * stride_vbt + kh * stride_vbh
        vdt = V_buf.dtype.element_ty
        v1 = tl.load(vsrc + offs, mask=mask, other=0.0)
        v2 = tl.load(vsrc + HALF + offs, mask=mask, other=0.0)
        tl.store(vb + offs, v1.to(vdt), mask=mask)
        tl.store(vb + HALF + offs, v2.to(vdt), mask=mask)


def rope_store_kv(
    cos_sin: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    loc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, KVH, D] by cos|sin rows [T, 2D]; write rotated k and v [T, KVH, D] to
    k_buf/v_buf [slots, KVH, D] at slots `loc` [T]. Returns the rotated (q, k), contiguous.

    The head dimension of q, k and v must be contiguous (stride 1); token and head strides are free.
    """
    t, num_heads, d = q.shape
    num_kv = k.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if cos_sin.stride(-1) != 1:
        cos_sin = cos_sin.contiguous()
    if cos_sin.dtype != q.dtype:
        cos_sin = cos_sin.to(q.dtype)
    qo = torch.empty((t, num_heads, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((t, num_kv, d), dtype=k.dtype, device=k.device)
    if t == 0:
        return qo, ko
    half = d // 2
    _rope_store_kernel[(t, num_heads + num_kv)](
        q, k, v, qo, ko, k_buf, v_buf, loc, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        cos_sin.stride(0),
        NUM_Q_HEADS=num_heads,
        HALF=half,
        BLOCK=max(16, triton.next_power_of_2(half)),
        num_warps=1 if half <= 64 else 2,
    )  # fmt: skip
    return qo, ko
