"""Fused MoE routing in one launch per layer: softmax, top-k, renormalisation, replica dispatch and
expert-load counting.

In PyTorch the same is 5-10 kernels per layer (softmax, topk, sum, div, cast, two gathers for the
replica pick, where for the local slot, index_add for the recorder); at batch 1 of a 48-layer model those
launches cost more than the router's arithmetic. One program handles one token: it loads the token's
logits row, keeps the k largest probabilities (ties go to the lower expert id, as torch.topk does on
distinct values), and writes float32 weights and int32 expert ids.

With a placement (`moe/dispatch.py`), the logical expert becomes a physical slot: replica
`sel % logcnt[e]` of `log2phy[e]`, where `sel` is the token's owner rank (static) or the token index
(dynamic); then, when the slots of this rank are a range [slot_lo, slot_lo + slots_local), a slot outside
it becomes -1 (computed by another rank). The expert-load counts (`counts`, int32 per physical slot) are
incremented with atomics, skipping rows whose `token_mask` is 0 (CUDA-graph padding rows): integer
atomics commute, so the counts are exact and the same as an eager run's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import pdl
from tokenspeed.runtime.moe.dispatch import DispatchView

DISPATCH_CODES = {"none": 0, "static": 1, "dynamic": 2}


@triton.jit
def top_k_choices(Logits, stride_l, t, E, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                  RENORM: tl.constexpr):  # fmt: skip
    """Token t's routing from its logits row: float32 softmax, the TOP_K largest probabilities (ties to the
    lower expert id, as torch.topk on distinct values), renormalised to sum to 1 with RENORM. Returns
    (weights [BLOCK_K], expert ids [BLOCK_K]); entries past TOP_K are zero. Also run inside the MoE GEMV's
    first launch (`gemv.py`), so both choose alike."""
    offs = tl.arange(0, BLOCK_E)
    emask = offs < E
    x = tl.load(Logits + t * stride_l + offs, mask=emask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(emask, p, 0.0)
    p = p / tl.sum(p, 0)
    kk = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        v = tl.max(p, 0)
        idx = tl.min(tl.where(p == v, offs, BLOCK_E), 0)
        top_w = tl.where(kk == j, v, top_w)
        top_i = tl.where(kk == j, idx, top_i)
        p = tl.where(offs == idx, -1.0, p)
    if RENORM:
        top_w = top_w / tl.sum(tl.where(kk < TOP_K, top_w, 0.0), 0)
    return top_w, top_i


@triton.jit
def _route_kernel(
    Logits,
    stride_l,
    Weights,
    Ids,
    Log2phy,
    Logcnt,
    Counts,
    Mask,
    E,
    R,
    ep_size,
    slot_lo,
    slots_local,
    TOP_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RENORM: tl.constexpr,
    DISPATCH: tl.constexpr,
    LOCALIZE: tl.constexpr,
    RECORD: tl.constexpr,
    MASKED: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.release(PDL)
    pdl.wait(PDL)  # the router's logits are the previous kernel's output (kernels/pdl.py)
    t = tl.program_id(0)
    top_w, top_i = top_k_choices(Logits, stride_l, t.to(tl.int64), E, TOP_K, BLOCK_E, BLOCK_K, RENORM)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < TOP_K
    ids = top_i
    if DISPATCH != 0:
        cnt = tl.load(Logcnt + top_i, mask=kmask, other=1)
        if DISPATCH == 1:
            sel = t % ep_size
        else:
            sel = t
        pick = sel % cnt
        ids = tl.load(Log2phy + top_i.to(tl.int64) * R + pick, mask=kmask, other=0)
    if RECORD:
        live = kmask
        if MASKED:
            live = live & (tl.load(Mask + t) != 0)
        tl.atomic_add(Counts + ids, tl.full([BLOCK_K], 1, tl.int32), mask=live)
    if LOCALIZE:
        local = ids - slot_lo
        ids = tl.where((local >= 0) & (local < slots_local), local, -1)
    base = t.to(tl.int64) * TOP_K
    tl.store(Weights + base + kk, top_w, mask=kmask)
    tl.store(Ids + base + kk, ids, mask=kmask)


def fused_route(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    dispatch: DispatchView | None = None,
    counts: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, E] router logits -> (float32 weights [T, k], int32 expert ids [T, k]).

    `counts` (int32 [num_physical], optional) gains one per routed (token, k) choice whose token has a
    non-zero `token_mask` entry (all tokens when `token_mask` is None)."""
    t, e = logits.shape
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t == 0:
        return weights, ids
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    d = dispatch
    code = DISPATCH_CODES["none"] if d is None else DISPATCH_CODES[d.algorithm]
    dummy = ids  # a valid pointer for arguments a constexpr switches off
    if counts is not None and counts.dtype != torch.int32:
        raise TypeError("fused_route counts must be int32")
    block_e = triton.next_power_of_2(e)
    _route_kernel[(t,)](
        logits,
        logits.stride(0),
        weights,
        ids,
        dummy if d is None else d.log2phy,
        dummy if d is None else d.logcnt,
        dummy if counts is None else counts,
        dummy if token_mask is None else token_mask,
        e,
        1 if d is None else d.log2phy.shape[1],
        1 if d is None else d.ep_size,
        0 if d is None else d.slot_lo,
        0 if d is None else d.slots_local,
        TOP_K=top_k,
        BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(top_k),
        RENORM=renormalize,
        DISPATCH=code,
        LOCALIZE=d is not None and d.localize,
        RECORD=counts is not None,
        MASKED=counts is not None and token_mask is not None,
        num_warps=1 if block_e <= 256 else 4,
        **pdl.launch_kwargs(logits.device),
    )
    return weights, ids
