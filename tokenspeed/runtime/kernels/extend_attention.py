"""Extend (prefill) attention in Triton over the paged KV cache.

Each request brings `extend_len` new tokens on top of `prefix_len` already-cached tokens (a prefill
chunk, a prefix-cache hit, or a decode with extend_len 1 in a mixed batch). The new tokens' K/V are in
the pool before this kernel runs, so one pass reads every key through `req_to_token`: new token `i`
sees keys `[0, prefix_len + i]`.

Over an FP8 cache the new tokens' keys are read instead from the K/V the layer computed (`k_new`,
`v_new`, in q's dtype), and only the prefix from the cache, with its scales: a prompt then attends over
its own K/V unrounded, as FlashInfer's ragged prefill (and SGLang's Triton extend) does, and only what
was cached before carries FP8's rounding.

One program per (request, query head, block of BLOCK_M new tokens). The key loop runs in two parts: the
keys every row of the block sees (no mask but the bounds), then the diagonal band where the causal mask
applies, so the common case pays no per-element mask.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tokenspeed.runtime.kernels.online_softmax import attend_keys, cache_strides


@triton.jit
def _extend_kernel(
    Q, O, K_buf, V_buf, K_new, V_new,  # noqa: E741 - O: the attention output, named as in the literature
    req_to_token, req_pool_indices, seq_lens, extend_lens, qo_start, sm_scale, k_scale, v_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
    stride_knt, stride_knh, stride_vnt, stride_vnh,
    KV_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, IEEE: tl.constexpr, FP32_PV: tl.constexpr, FRESH: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    ext = tl.load(extend_lens + b)
    if mblk * BLOCK_M < ext:
        seq = tl.load(seq_lens + b)
        prefix = seq - ext
        row = tl.load(req_pool_indices + b).to(tl.int64)
        q0 = tl.load(qo_start + b).to(tl.int64)
        kvh = h // KV_GROUP

        offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = offs_m < ext
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        q = tl.load(
            Q + (q0 + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
            mask=mmask[:, None] & dmask[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Keys before the block's first row are visible to every row; the band after needs the mask.
        full_hi = prefix + mblk * BLOCK_M
        kv_end = prefix + tl.minimum(ext, (mblk + 1) * BLOCK_M)
        # The keys still in the cache (an FP8 one's with its scales): all the visible ones, or with FRESH the
        # prefix only, the new tokens' keys then coming from the layer's own K/V (rows from q0 on).
        cached_hi = prefix if FRESH else full_hi
        acc, m_i, l_i = attend_keys(
            q, acc, m_i, l_i, K_buf, V_buf, req_to_token, row, kvh, offs_m, prefix, 0, cached_hi,
            sm_scale * k_scale, v_scale, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t, offs_d, dmask,
            CAUSAL=False, BLOCK_N=BLOCK_N, IEEE=IEEE, FP32_PV=FP32_PV, DIRECT=False,
        )  # fmt: skip
        if FRESH:
            kn, vn, new_row, new_scale, new_v_scale = K_new, V_new, q0 - prefix, sm_scale, 1.0
            skt, skh, svt, svh = stride_knt, stride_knh, stride_vnt, stride_vnh
        else:
            kn, vn, new_row, new_scale, new_v_scale = K_buf, V_buf, row, sm_scale * k_scale, v_scale
            skt, skh, svt, svh = stride_kt, stride_kh, stride_vt, stride_vh
        # New tokens before the block's first row (none without FRESH: the cache part covered them), then
        # the band under the causal mask.
        acc, m_i, l_i = attend_keys(
            q, acc, m_i, l_i, kn, vn, req_to_token, new_row, kvh, offs_m, prefix, cached_hi, full_hi, new_scale,
            new_v_scale, skt, skh, svt, svh, stride_r2t, offs_d, dmask,
            CAUSAL=False, BLOCK_N=BLOCK_N, IEEE=IEEE, FP32_PV=FP32_PV, DIRECT=FRESH,
        )  # fmt: skip
        acc, m_i, l_i = attend_keys(
            q, acc, m_i, l_i, kn, vn, req_to_token, new_row, kvh, offs_m, prefix, full_hi, kv_end, new_scale,
            new_v_scale, skt, skh, svt, svh, stride_r2t, offs_d, dmask,
            CAUSAL=True, BLOCK_N=BLOCK_N, IEEE=IEEE, FP32_PV=FP32_PV, DIRECT=FRESH,
        )  # fmt: skip
        out = acc / l_i[:, None]
        tl.store(
            O + (q0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
            out.to(O.dtype.element_ty),
            mask=mmask[:, None] & dmask[None, :],
        )


def extend_attention(
    q,
    out,
    k_buf,
    v_buf,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_lens,
    qo_start,
    max_extend_len: int,
    sm_scale: float,
    reduce_in_fp32: bool = False,
    k_new=None,
    v_new=None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """q/out: [T, H, D] with each request's new tokens contiguous from `qo_start[b]`; the new tokens'
    K/V must already be stored in `k_buf`/`v_buf`. With `k_new`/`v_new` ([T, KVH, D], in q's rows) the new
    tokens' keys are read from them and only the prefix from the cache, whose scores count `k_scale` and
    values `v_scale` times (an FP8 cache's scales); without them the caller folds the scales in."""
    _, num_heads, head_dim = q.shape
    bs = seq_lens.shape[0]
    group = num_heads // k_buf.shape[1]
    block_d = max(16, triton.next_power_of_2(head_dim))
    ieee = q.dtype.itemsize == 4 or reduce_in_fp32
    if ieee or block_d > 128:
        block_m, block_n, warps, stages = 64, 32, 4, 2
    else:
        block_m, block_n, warps, stages = 128, 64, 8, 3
    if max_extend_len <= 16:
        block_m = 16
    elif max_extend_len <= 64:
        block_m = min(block_m, 64)
    fresh = k_new is not None
    if not fresh:
        k_new, v_new = k_buf, v_buf  # unread (FRESH is off); any tensors with strides serve
    grid = (bs, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, out, k_buf, v_buf, k_new, v_new, req_to_token, req_pool_indices, seq_lens, extend_lens, qo_start,
        sm_scale, k_scale, v_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *cache_strides(k_buf, v_buf, req_to_token),
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        KV_GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        IEEE=q.dtype.itemsize == 4, FP32_PV=reduce_in_fp32, FRESH=fresh, num_warps=warps, num_stages=stages,
    )  # fmt: skip
