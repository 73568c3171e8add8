"""Sampling from logits in one Triton launch: temperature, top-k, top-p, min-p, Gumbel-max draw.

One program per row streams the row's logits a few times instead of sorting the vocabulary:
1. the maximum, the minimum and the softmax normaliser of the temperature-scaled logits;
2. only when the row asks for it, a bisection on the logit value for the top-k threshold (the largest t
   with at least k logits >= t) and then for the top-p threshold (the largest t whose kept mass, among
   the top-k survivors, reaches p, so top-p sees the distribution renormalised after top-k);
3. min-p as a closed form: p_i >= min_p * p_max  <=>  x_i >= max + log(min_p);
4. argmax of x + Gumbel noise over the kept logits, which draws exactly from their softmax.
The noise is Philox keyed by a per-row seed computed on the host, so a request with a seed gets the same
tokens whatever else is in the batch, and nothing here waits on the device.
Rows with temperature ~0 take the plain argmax (first index among ties, like torch.argmax).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GREEDY_TEMPERATURE = 1e-5
BISECT_STEPS = 24


@triton.jit
def _scaled_logits(base, c, V, inv_t, BLOCK: tl.constexpr):
    """(offsets, in-vocabulary mask, logits) of the row's block [c, c + BLOCK): the logits in float32
    divided by the temperature, -inf past the vocabulary."""
    offs = c + tl.arange(0, BLOCK)
    mask = offs < V
    return offs, mask, tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32) * inv_t


@triton.jit
def _count_at_least(base, V, inv_t, cut, BLOCK: tl.constexpr):
    """How many of the row's scaled logits are >= cut (top-k's bisection)."""
    cnt = 0
    for c in range(0, V, BLOCK):
        _, _, x = _scaled_logits(base, c, V, inv_t, BLOCK)
        cnt += tl.sum((x >= cut).to(tl.int32), 0)
    return cnt


@triton.jit
def _mass_at_least(base, V, inv_t, m, cut, BLOCK: tl.constexpr):
    """The unnormalised probability mass, exp(x - m), of the row's scaled logits x >= cut (top-p's)."""
    mass = 0.0
    for c in range(0, V, BLOCK):
        _, _, x = _scaled_logits(base, c, V, inv_t, BLOCK)
        mass += tl.sum(tl.where(x >= cut, tl.exp(x - m), 0.0), 0)
    return mass


@triton.jit
def _sample_kernel(
    Logits,
    Out,
    Temp,
    TopK,
    TopP,
    MinP,
    Seeds,
    stride_l,
    V,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    GREEDY_T: tl.constexpr,
):
    row = tl.program_id(0)
    base = Logits + row.to(tl.int64) * stride_l
    temp = tl.load(Temp + row)
    greedy = temp <= GREEDY_T
    inv_t = tl.where(greedy, 1.0, 1.0 / tl.maximum(temp, GREEDY_T))
    top_k = tl.load(TopK + row)
    top_p = tl.load(TopP + row)
    min_p = tl.load(MinP + row)
    seed = tl.load(Seeds + row)

    # Pass 1: max, min and normaliser of the scaled logits.
    m = float("-inf")
    lo = float("inf")
    s = 0.0
    for c in range(0, V, BLOCK):
        offs, mask, x = _scaled_logits(base, c, V, inv_t, BLOCK)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.where(mask, tl.exp(x - m_new), 0.0), 0)
        lo = tl.minimum(lo, tl.min(tl.where(mask, x, float("inf")), 0))
        m = m_new

    thr = float("-inf")
    if not greedy:
        if (top_k > 0) & (top_k < V):
            a = lo
            b = m
            for _ in range(STEPS):
                mid = 0.5 * (a + b)
                ok = _count_at_least(base, V, inv_t, mid, BLOCK) >= top_k
                a = tl.where(ok, mid, a)
                b = tl.where(ok, b, mid)
            thr = a
        if top_p < 1.0:
            z = _mass_at_least(base, V, inv_t, m, thr, BLOCK)
            a = tl.maximum(thr, lo)
            b = m
            for _ in range(STEPS):
                mid = 0.5 * (a + b)
                ok = _mass_at_least(base, V, inv_t, m, mid, BLOCK) >= top_p * z
                a = tl.where(ok, mid, a)
                b = tl.where(ok, b, mid)
            thr = tl.maximum(thr, a)
        if min_p > 0.0:
            thr = tl.maximum(thr, m + tl.log(min_p))

    # Final pass: Gumbel-max over the kept logits (noise off for greedy rows).
    best = float("-inf")
    best_idx = 0
    for c in range(0, V, BLOCK):
        offs, mask, x = _scaled_logits(base, c, V, inv_t, BLOCK)
        u = tl.rand(seed, offs)
        u = tl.minimum(tl.maximum(u, 1e-10), 1.0 - 1e-7)
        g = -tl.log(-tl.log(u))
        y = tl.where(greedy, x, x + g)
        y = tl.where(mask & (x >= thr), y, float("-inf"))
        blk_best = tl.max(y, 0)
        blk_idx = tl.argmax(y, 0)
        better = blk_best > best
        best_idx = tl.where(better, c + blk_idx, best_idx)
        best = tl.where(better, blk_best, best)
    tl.store(Out + row, best_idx.to(tl.int64))


def sample_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
) -> torch.Tensor:
    """logits [S, V] (any float dtype, last dim contiguous); per-row float32 temperature/top_p/min_p,
    int32 top_k (<= 0 or >= V disables it), int64 seeds. Returns [S] int64 token ids."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    block = min(4096, triton.next_power_of_2(vocab))
    _sample_kernel[(rows,)](
        logits,
        out,
        temperature,
        top_k,
        top_p,
        min_p,
        seeds,
        logits.stride(0),
        vocab,
        BLOCK=block,
        STEPS=BISECT_STEPS,
        GREEDY_T=GREEDY_TEMPERATURE,
        num_warps=8 if block >= 2048 else 4,
    )
    return out
