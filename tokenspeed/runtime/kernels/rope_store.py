"""RoPE and the KV-cache write in one launch: the step between the QKV projection and attention.

Unfused, a layer runs the rotary kernel (q and k rotated into new tensors) and then the K/V store (rotated
k and v copied into the pool at `out_cache_loc`): two launches per layer, 64 per decode step of a 32-layer
model, each a few microseconds of a step that reads the weights in about 3.5 ms. Here one program per
(token, head) rotates a query head, or rotates a key head and writes it to the pool together with the value
head. q, k and v are read through their strides, so the views the QKV split produces need no copy. The
rotation is `fused_ops.rotate_qk_head`, the one `fused_ops.apply_rope` runs (rounded as the PyTorch reference
rounds), so outputs are bit-identical to the unfused pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels.fused_ops import rope_launch, rope_operands, rotate_qk_head, store_halves


@triton.jit
def _rope_store_kernel(
    Q, K, V, QO, KO, K_buf, V_buf, LOC, CS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_kbt, stride_kbh, stride_vbt, stride_vbh,
    stride_cs,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, KVH, D] by cos|sin rows [T, 2D]; write rotated k and v [T, KVH, D] to
    k_buf/v_buf [slots, KVH, D] at slots `loc` [T]. Returns the rotated (q, k), contiguous.

    The head dimension of q, k and v must be contiguous (stride 1); token and head strides are free.
    """
    cos_sin, q, k, qo, ko = rope_operands(cos_sin, q, k)
    if v.stride(-1) != 1:
        v = v.contiguous()
    if q.shape[0] == 0:
        return qo, ko
    grid, consts = rope_launch(q, k)
    _rope_store_kernel[grid](
        q, k, v, qo, ko, k_buf, v_buf, loc, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        cos_sin.stride(0),
        **consts,
    )  # fmt: skip
    return qo, ko
