"""The online-softmax key loop shared by the Triton attention kernels (decode and extend).

A program holds a block of query rows and walks a range of one request's cached keys in BLOCK_N steps,
keeping per row the running max `m_i`, the running sum of exponentials `l_i` and the unnormalised output
`acc`, so the softmax over all keys needs one pass over K and V (flash attention's recurrence):

    m' = max(m, max_j qk_j);  l' = l * exp(m - m') + sum_j exp(qk_j - m');  acc' = acc * exp(m - m') + P V
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def cache_strides(
    k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor
) -> tuple[int, int, int, int, int]:
    """(stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t): the strides `attend_keys` reads the paged
    K/V cache [slots, kv_heads, head_dim] and the request->slot table by, in its order."""
    return k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), req_to_token.stride(0)


@triton.jit
def attend_keys(
    q,
    acc,
    m_i,
    l_i,
    K_buf,
    V_buf,
    req_to_token,
    row,
    kvh,
    offs_m,
    prefix,
    lo,
    hi,
    sm_scale,
    v_scale,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_r2t,
    offs_d,
    dmask,
    CAUSAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    FP32_PV: tl.constexpr,
    DIRECT: tl.constexpr,
):
    """Fold the keys `[lo, hi)` of one request into the running (acc, m_i, l_i) of the query rows `q`.

    Keys are read through `req_to_token[row]` from kv head `kvh`; with DIRECT, key position `n` is row
    `row + n` of `K_buf`/`V_buf` (a request's new tokens, contiguous, as the layer computed them). Each
    value row counts `v_scale` times (an FP8 cache's V scale; 1.0 for values in q's dtype). With CAUSAL,
    query row `m` (at position `prefix + offs_m[m]`) sees only keys up to its own position; without it
    every key in range counts.
    Returns the new (acc, m_i, l_i): the unnormalised output, the running max and the running sum.
    """
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        if DIRECT:
            loc = (row + offs_n).to(tl.int64)
        else:
            loc = tl.load(req_to_token + row * stride_r2t + offs_n, mask=nmask, other=0).to(tl.int64)
        kv_mask = nmask[:, None] & dmask[None, :]
        # An FP8 cache is read in q's dtype; the caller folds its per-tensor K scale into sm_scale and
        # its V scale into v_scale or the output. A no-op for a cache in q's dtype.
        k = tl.load(
            K_buf + loc[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0
        ).to(q.dtype)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        qk = qk * sm_scale
        if CAUSAL:
            keep = (offs_n[None, :] <= (prefix + offs_m)[:, None]) & nmask[None, :]
        else:
            keep = nmask[None, :] & (offs_m[:, None] >= 0)
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V_buf + loc[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0
        ).to(q.dtype)
        if FP32_PV:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        elif IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv * v_scale
        m_i = m_new
    return acc, m_i, l_i
