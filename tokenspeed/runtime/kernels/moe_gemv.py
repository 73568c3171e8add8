"""Small-batch expert path: read only the routed experts' rows, no grouping step, two launches.

At batch 1-8 a decode step routes a handful of (token, expert) pairs, nearly all to different experts,
so grouping rows by expert buys nothing and tensor-core tiles of 16 rows would be mostly padding. Here
every program streams a slice of one routed expert's weight rows once, with CUDA-core dot products:

- `gemv_gate_up_silu`: program (pair, column block) -> act[pair, cols] = silu(x@gate^T) * (x@up^T);
- `gemv_down_sum`: program (token, column block) -> out[token, cols] = sum over the token's k pairs of
  weight * act[pair] @ down^T, in float32, written once in the activation dtype (the k-sum needs no
  extra buffer or launch, and no atomics, so results do not depend on scheduling).

Pairs whose expert id is < 0 (another rank's) are skipped. Also `sum_pairs`, the k-sum of the grouped
path's per-pair outputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_gate_up_kernel(
    X,
    W,
    Act,
    Ids,
    INTER,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_am,
    TOP_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    p = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(Ids + p)
    if e >= 0:
        tok = (p // TOP_K).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        offs_k = tl.arange(0, BLOCK_K)
        x_ptr = X + tok * stride_xm + offs_k
        g_ptr = W + e.to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        u_ptr = g_ptr + INTER * stride_wn
        acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                xv = tl.load(x_ptr).to(tl.float32)
                g = tl.load(g_ptr, mask=nmask[:, None], other=0.0)
                u = tl.load(u_ptr, mask=nmask[:, None], other=0.0)
            else:
                kmask = offs_k + k0 < K
                xv = tl.load(x_ptr, mask=kmask, other=0.0).to(tl.float32)
                g = tl.load(g_ptr, mask=nmask[:, None] & kmask[None, :], other=0.0)
                u = tl.load(u_ptr, mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc_g += g.to(tl.float32) * xv[None, :]
            acc_u += u.to(tl.float32) * xv[None, :]
            x_ptr += BLOCK_K
            g_ptr += BLOCK_K
            u_ptr += BLOCK_K
        gate = tl.sum(acc_g, 1)
        up = tl.sum(acc_u, 1)
        h = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(Act + p.to(tl.int64) * stride_am + offs_n, h.to(Act.dtype.element_ty), mask=nmask)


@triton.jit
def _gemv_down_sum_kernel(
    Act,
    W,
    Out,
    Ids,
    Weights,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        p = t.to(tl.int64) * TOP_K + j
        e = tl.load(Ids + p)
        if e >= 0:
            w = tl.load(Weights + p)
            a_ptr = Act + p * stride_am + offs_k
            b_ptr = (
                W + e.to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
            )
            for k0 in range(0, K, BLOCK_K):
                if EVEN_K:
                    a = tl.load(a_ptr).to(tl.float32)
                    b = tl.load(b_ptr, mask=nmask[:, None], other=0.0)
                else:
                    kmask = offs_k + k0 < K
                    a = tl.load(a_ptr, mask=kmask, other=0.0).to(tl.float32)
                    b = tl.load(b_ptr, mask=nmask[:, None] & kmask[None, :], other=0.0)
                acc += b.to(tl.float32) * (a * w)[None, :]
                a_ptr += BLOCK_K
                b_ptr += BLOCK_K
    out = tl.sum(acc, 1)
    tl.store(Out + t.to(tl.int64) * stride_om + offs_n, out.to(Out.dtype.element_ty), mask=nmask)


@triton.jit
def _sum_pairs_kernel(PerPair, Ids, Out, N, stride_p, stride_o, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        p = t.to(tl.int64) * TOP_K + j
        e = tl.load(Ids + p)
        acc += tl.load(PerPair + p * stride_p + offs, mask=mask & (e >= 0), other=0.0)
    tl.store(Out + t.to(tl.int64) * stride_o + offs, acc.to(Out.dtype.element_ty), mask=mask)


def gemv_gate_up_silu(x: torch.Tensor, w13: torch.Tensor, ids: torch.Tensor, cfg) -> torch.Tensor:
    t, k_in = x.shape
    top_k = ids.shape[1]
    inter = w13.shape[1] // 2
    act = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    bn, bk = cfg.gemv_block_n, cfg.gemv_block_k
    _gemv_gate_up_kernel[(t * top_k, triton.cdiv(inter, bn))](
        x,
        w13,
        act,
        ids,
        inter,
        k_in,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        act.stride(0),
        TOP_K=top_k,
        EVEN_K=k_in % bk == 0,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=cfg.gemv_warps,
    )
    return act


def gemv_down_sum(
    act: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, out_dtype, cfg
) -> torch.Tensor:
    t, top_k = ids.shape
    n_out, k_in = w2.shape[1], w2.shape[2]
    out = torch.empty((t, n_out), dtype=out_dtype, device=act.device)
    bn, bk = cfg.gemv_down_block_n, cfg.gemv_down_block_k
    _gemv_down_sum_kernel[(t, triton.cdiv(n_out, bn))](
        act,
        w2,
        out,
        ids,
        weights,
        n_out,
        k_in,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        out.stride(0),
        TOP_K=top_k,
        EVEN_K=k_in % bk == 0,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=cfg.gemv_warps,
    )
    return out


def sum_pairs(per_pair: torch.Tensor, ids: torch.Tensor, out_dtype) -> torch.Tensor:
    """[T * k, H] -> [T, H]: each token's k rows summed (rows of ids < 0 skipped), in float32."""
    t, top_k = ids.shape
    n = per_pair.shape[1]
    out = torch.empty((t, n), dtype=out_dtype, device=per_pair.device)
    block = min(1024, triton.next_power_of_2(n))
    _sum_pairs_kernel[(t, triton.cdiv(n, block))](
        per_pair, ids, out, n, per_pair.stride(0), out.stride(0), TOP_K=top_k, BLOCK_N=block, num_warps=4
    )
    return out
