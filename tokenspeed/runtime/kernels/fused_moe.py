"""Fused MoE experts in Triton (`--moe-backend triton`): two grouped GEMMs over tokens sorted by expert.

The torch reference loops over `unique(topk_ids).tolist()` (a host sync per layer, and one small GEMM per
expert). Here the (token, expert) pairs are grouped on the device into blocks of BLOCK_M rows that all
belong to one expert (`align_by_expert`, padded per expert to a multiple of BLOCK_M); the first kernel
computes gate|up for every row from its expert's `w13`, SiLU-and-mul runs on the result, and the second
kernel computes `w2` and scales each row by its routing weight, writing it back at its (token, slot)
place; the k slots of a token are then summed. Every shape depends only on the number of tokens, so the
whole layer can be captured in a CUDA graph.

Expert ids < 0 (experts held by another rank under expert parallelism) are routed to a spill bucket
whose blocks the kernels skip, so those slots contribute zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class ExpertAlignment:
    sorted_ids: torch.Tensor  # [max_rows] flat (token * k + slot) index per row; num_pairs = padding
    block_expert: torch.Tensor  # [num_blocks] expert of each block; >= num_experts: skip
    num_pairs: int
    block_m: int


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertAlignment:
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    flat = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)  # spill bucket
    buckets = num_experts + 1
    counts = torch.zeros(buckets, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    sorted_vals, order = torch.sort(flat, stable=True)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=flat.device) - first[sorted_vals]
    dest = starts[sorted_vals] + rank
    max_rows = n + buckets * (block_m - 1)
    max_rows = triton.cdiv(max_rows, block_m) * block_m
    sorted_ids = torch.full((max_rows,), n, dtype=torch.int64, device=flat.device)
    sorted_ids[dest] = order
    block_start = torch.arange(0, max_rows, block_m, device=flat.device)
    block_expert = torch.searchsorted(ends, block_start, right=True)
    return ExpertAlignment(sorted_ids, block_expert, n, block_m)


@triton.jit
def _moe_gemm_kernel(
    A,
    B,
    C,
    sorted_ids,
    block_expert,
    weights,
    num_pairs,
    num_experts,
    N,
    K,
    stride_am,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    TOP_K: tl.constexpr,
    GATHER_A: tl.constexpr,
    SCATTER_C: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert + pid_m)
    if e < num_experts:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        ids = tl.load(sorted_ids + rows)
        valid = ids < num_pairs
        if GATHER_A:
            a_rows = ids // TOP_K  # the token of each (token, slot) pair
        else:
            a_rows = rows.to(tl.int64)  # A is already laid out by sorted row
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        b_base = B + e.to(tl.int64) * stride_be
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < K
            a = tl.load(
                A + a_rows[:, None] * stride_am + offs_k[None, :],
                mask=valid[:, None] & kmask[None, :],
                other=0.0,
            )
            b = tl.load(
                b_base + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk,
                mask=nmask[None, :] & kmask[:, None],
                other=0.0,
            )
            if IEEE:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
        if MUL_WEIGHT:
            w = tl.load(weights + ids, mask=valid, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
        if SCATTER_C:
            c_rows = ids
        else:
            c_rows = rows.to(tl.int64)
        tl.store(
            C + c_rows[:, None] * stride_cm + offs_n[None, :],
            acc.to(C.dtype.element_ty),
            mask=valid[:, None] & nmask[None, :],
        )


def _gemm(
    a, w, c, al: ExpertAlignment, weights, top_k: int, gather_a: bool, scatter_c: bool, mul_weight: bool
):
    num_experts, n_out, k_in = w.shape
    ieee = a.dtype == torch.float32
    block_n = 64 if ieee else 128
    block_k = 32 if ieee else 64
    grid = (al.block_expert.numel(), triton.cdiv(n_out, block_n))
    _moe_gemm_kernel[grid](
        a,
        w,
        c,
        al.sorted_ids,
        al.block_expert,
        weights,
        al.num_pairs,
        num_experts,
        n_out,
        k_in,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        c.stride(0),
        TOP_K=top_k,
        GATHER_A=gather_a,
        SCATTER_C=scatter_c,
        MUL_WEIGHT=mul_weight,
        IEEE=ieee,
        BLOCK_M=al.block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
        num_stages=3 if not ieee else 2,
    )


def fused_experts(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_* [T, k] -> [T, H]."""
    from tokenspeed.runtime.kernels.fused_ops import silu_and_mul

    t, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, two_i, _ = w13.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    pairs = t * top_k
    block_m = 16 if pairs <= 1024 else 64
    al = align_by_expert(topk_ids, num_experts, block_m)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    gate_up = torch.empty((al.sorted_ids.numel(), two_i), dtype=x.dtype, device=x.device)
    _gemm(x, w13, gate_up, al, weights, top_k, gather_a=True, scatter_c=False, mul_weight=False)
    act = silu_and_mul(gate_up)
    per_slot = torch.zeros((pairs, hidden), dtype=torch.float32, device=x.device)
    _gemm(act, w2, per_slot, al, weights, top_k, gather_a=False, scatter_c=True, mul_weight=True)
    return per_slot.view(t, top_k, hidden).sum(dim=1).to(x.dtype)


def enable_fused_moe(model: torch.nn.Module) -> int:
    """Route every stacked-experts module of `model` (those with `w13`/`w2` and a
    `forward(x, topk_weights, topk_ids)`) through `fused_experts`; returns how many were switched."""
    switched = 0
    for module in model.modules():
        if hasattr(module, "w13") and hasattr(module, "w2") and hasattr(module, "fused_moe"):
            module.fused_moe = fused_experts
            switched += 1
    return switched
