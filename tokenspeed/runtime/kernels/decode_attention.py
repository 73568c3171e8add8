"""Paged decode attention in Triton: one new token per request over its whole cached context.

Flash-decoding. Stage 1 splits each request's context into `num_splits` equal parts and runs one program
per (request, kv head, split); the program covers every query head of that kv head's GQA group at once, so
each K/V row is read from memory exactly once per step (decode is memory-bound: the bytes read are the
cost). Stage 2 merges the splits by their log-sum-exp.

One launch (`DecodeLaunch.one_launch`, off unless TOKENSPEED_DECODE_ONE_LAUNCH=1 until measured on the
device): at a small batch the whole layer's attention reads a few MB, under a microsecond of bandwidth, so
its two launches and their tails are most of its time (6.1 us a layer at batch 1 on the H200 against a
0.5 us limit, results/gpu_decode_attention.json). Then stage 1 merges too: each program counts its arrival
on an int32 per (request, kv head) after writing its partial, and the last of the `num_splits` to arrive
merges them all and resets the count for the next launch (a replayed graph). With one split the program
writes the output directly.

The split count depends on the batch size only, never on the context lengths, so a step replayed from a
CUDA graph launches the same grid as the captured one while each program derives its token range from
`seq_lens` on the device.

KV layout: `k_buf`/`v_buf` are `[num_slots, kv_heads, head_dim]`; a request's token `i` lives at slot
`req_to_token[row, i]`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import pdl
from tokenspeed.runtime.kernels.online_softmax import attend_keys, cache_strides

# At most this many splits a request: on the H200 (benchmarks/results/gpu_decode_attention.json) one request
# over 1k tokens ran fastest at 16 of the 16/32/64 tried; each split adds a partial row to write and merge.
MAX_SPLITS = 16


@dataclass(frozen=True)
class DecodeLaunch:
    """Stage 1's tile and pipeline: keys per loop step, warps, software-pipelining stages."""

    block_n: int
    num_warps: int = 4
    num_stages: int = 3
    one_launch: bool = False  # stage 1 merges the splits itself (the module's docstring)


ONE_LAUNCH_ENV = "TOKENSPEED_DECODE_ONE_LAUNCH"


def one_launch_enabled() -> bool:
    """Whether decode attention runs in one launch (TOKENSPEED_DECODE_ONE_LAUNCH=1; off by default until
    `benchmarks/decode_ab.py` shows it faster on the device)."""
    return os.environ.get(ONE_LAUNCH_ENV, "0") == "1"


def decode_num_splits(batch_size: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits per request: the most (a power of two, <= MAX_SPLITS) that keep stage 1 at no more than about
    four programs per multiprocessor. Rounding up instead (eight a multiprocessor at batch 64 on
    Qwen3-30B-A3B's 4 KV heads) was 1.34x slower on the H200: four resident programs already keep the
    memory system busy, and each split adds a partial row to write and merge."""
    programs = max(1, batch_size * num_kv_heads)
    want = max(1, 4 * num_sms // programs)
    return int(min(MAX_SPLITS, 1 << (want.bit_length() - 1)))


def decode_launch(head_dim: int, fp32: bool, programs: int, num_sms: int, kv_bytes: int = 2) -> DecodeLaunch:
    """Stage 1's configuration for a grid of `programs` over a cache of `kv_bytes` a value. Measured on the
    H200 at context 1k with a bf16 cache (`benchmarks/decode_attention.py`): three pipeline stages hide the
    gathered K/V loads' latency (batch 64: 41.95 against 50.11 us a layer with two); with at least six
    programs a multiprocessor (batch 256) each walks a long key range, where 128 keys a step beat 64
    (145.0 against 150.0 us). Float32 and heads wider than 128 keep the smaller tile and two stages for their
    registers and shared memory.

    An FP8 cache (`kv_bytes` 1) keeps two stages below six programs a multiprocessor. Converting e4m3 to
    bf16 in the loop costs registers: with three stages Triton 3.6 (the H200 image's) gives the kernel 152 a
    thread on the 8B shape, so three programs fit on a multiprocessor, not the four `decode_num_splits`
    plans for; two stages take 128 there and on the Qwen3-30B-A3B shape, and four fit (65536 registers /
    (128 x 128 threads)). (Counts from sm_90 compiles on the CPU with every pointer and stride 16-aligned,
    as a launch specializes them, read with the cuobjdump Triton ships; Triton 3.9 gives other counts, so
    this rule is the H200 image's.) At 64 requests of 4k on the 8B shape (512 programs) three stages leave
    a second wave under a third full: the FP8 step took 15.74 ms under the bf16 rule against 14.10 ms under
    the rule before it (two stages, two splits; 2026-12-04, `gpu_decode_fp8_kv.json` and its earlier
    version), while the bf16 step got faster. Not yet re-timed with two stages (`device_run.sh
    decodeattnfp8`)."""
    if fp32 or head_dim > 128:
        return DecodeLaunch(block_n=32, num_stages=2)
    if programs >= 6 * num_sms:
        return DecodeLaunch(block_n=128)
    return DecodeLaunch(block_n=64, num_stages=2 if kv_bytes == 1 else 3)


@triton.jit
def _decode_stage1_kernel(
    Q, K_buf, V_buf, req_to_token, req_pool_indices, seq_lens, Mid_O, Mid_lse, Out, Arrivals, sm_scale,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
    stride_mob, stride_moh, stride_mos, stride_lb, stride_lh, stride_ob, stride_oh,
    KV_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    IEEE: tl.constexpr, FP32_PV: tl.constexpr, ONE_LAUNCH: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    # Under PDL (kernels/pdl.py) the merge may be scheduled while this runs; q and the new token's K/V are
    # the RoPE kernel's output.
    pdl.release(PDL)
    pdl.wait(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    offs_h = tl.arange(0, BLOCK_H)
    heads = kvh * KV_GROUP + offs_h
    hmask = offs_h < KV_GROUP
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM

    seq_len = tl.load(seq_lens + b)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=hmask[:, None] & dmask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    acc, m_i, l_i = attend_keys(
        q, acc, m_i, l_i, K_buf, V_buf, req_to_token, row, kvh, offs_h, 0, start, end, sm_scale, 1.0,
        stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t, offs_d, dmask,
        CAUSAL=False, BLOCK_N=BLOCK_N, IEEE=IEEE, FP32_PV=FP32_PV, DIRECT=False,
    )  # fmt: skip

    # An empty split (short context) leaves l_i == 0: it writes zeros and lse = -inf, which the merge
    # weighs by exp(-inf) = 0.
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    hd_mask = hmask[:, None] & dmask[None, :]
    if ONE_LAUNCH and NUM_SPLITS == 1:
        dst = Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(dst, out.to(Out.dtype.element_ty), mask=hd_mask)
    else:
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(
            Mid_O + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :],
            out,
            mask=hd_mask,
        )
        tl.store(Mid_lse + b * stride_lb + heads * stride_lh + split, lse, mask=hmask)
    if ONE_LAUNCH and NUM_SPLITS > 1:
        # Every thread's partial is stored before the arrival is counted (the barrier), and the count's
        # acquire-release at GPU scope makes the others' partials visible to the last program, which reads
        # them from L2 (.cg: its L1 may hold none of them, but never trust it to).
        tl.debug_barrier()
        slot = Arrivals + b * tl.num_programs(1) + kvh
        arrived = tl.atomic_add(slot, 1, sem="acq_rel")
        if arrived == NUM_SPLITS - 1:
            _merge_group(Mid_O, Mid_lse, Out, b, heads, hmask, offs_d, dmask, stride_mob, stride_moh,
                         stride_mos, stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS, BLOCK_H, BLOCK_S,
                         BLOCK_D)  # fmt: skip
            tl.store(slot, 0)  # ready for the next launch


@triton.jit
def _merge_group(
    Mid_O, Mid_lse, Out, b, heads, hmask, offs_d, dmask, stride_mob, stride_moh, stride_mos, stride_lb,
    stride_lh, stride_ob, stride_oh, NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One GQA group's heads merged over the splits by their log-sum-exp: stage 2's arithmetic, one split
    # at a time (a [heads, splits, head_dim] tile would not fit in registers).
    offs_s = tl.arange(0, BLOCK_S)
    lse_rows = Mid_lse + b * stride_lb + heads * stride_lh
    lse = tl.load(lse_rows[:, None] + offs_s[None, :], mask=hmask[:, None] & (offs_s < NUM_SPLITS)[None, :],
                  other=float("-inf"), cache_modifier=".cg")  # fmt: skip
    m = tl.max(lse, 1)
    m = tl.where(m > float("-inf"), m, 0.0)  # (rows past the group: no NaN from -inf - -inf)
    total = tl.sum(tl.exp(lse - m[:, None]), 1)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    hd_mask = hmask[:, None] & dmask[None, :]
    rows = Mid_O + b * stride_mob + heads[:, None] * stride_moh + offs_d[None, :]
    for s in tl.static_range(NUM_SPLITS):
        w = tl.exp(tl.load(lse_rows + s, mask=hmask, other=float("-inf"), cache_modifier=".cg") - m)
        part = tl.load(rows + s * stride_mos, mask=hd_mask, other=0.0, cache_modifier=".cg")
        acc += w[:, None] * part
    out = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=hd_mask)  # fmt: skip


@triton.jit
def _decode_stage2_kernel(
    Mid_O, Mid_lse, O,  # noqa: E741 - O: the attention output, named as in the literature
    stride_mob, stride_moh, stride_mos, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # Under PDL (kernels/pdl.py) the o projection's GEMV may start loading its weights while this runs.
    pdl.release(PDL)
    pdl.wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    smask = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    lse = tl.load(Mid_lse + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp(lse - m)
    w = tl.where(smask, w, 0.0)
    part = tl.load(
        Mid_O + b * stride_mob + h * stride_moh + offs_s[:, None] * stride_mos + offs_d[None, :],
        mask=smask[:, None] & dmask[None, :],
        other=0.0,
    )
    out = tl.sum(w[:, None] * part, 0) / tl.sum(w, 0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=dmask)


def decode_attention(
    q,
    k_buf,
    v_buf,
    out,
    req_to_token,
    req_pool_indices,
    seq_lens,
    mid_o,
    mid_lse,
    sm_scale: float,
    num_splits: int,
    reduce_in_fp32: bool = False,
    launch: DecodeLaunch | None = None,
    num_sms: int | None = None,
    arrivals: torch.Tensor | None = None,
) -> None:
    """q/out: [B, H, D]; k_buf/v_buf: [slots, KVH, D]; mid_o: [>=B, H, num_splits, D] fp32; mid_lse:
    [>=B, H, num_splits] fp32. Writes `out` in place (no allocation, so it can run inside a CUDA graph).
    `launch` overrides stage 1's tile and pipeline (benchmarks/decode_attention.py sweeps them); without it
    `decode_launch` picks one for the GPU's `num_sms` (the backend passes its count, read once), in one
    launch where `one_launch_enabled()`. `arrivals`: int32 [>= B * KVH], zeros, which a one-launch run with
    more than one split counts in and leaves zero again (without it, that run falls back to two launches)."""
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_h = max(16, triton.next_power_of_2(group))
    ieee = q.dtype.itemsize == 4
    if launch is None:
        if (
            num_sms is None
        ):  # (Triton's CPU interpreter has no multiprocessors to count; any number serves it)
            num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
        launch = decode_launch(head_dim, ieee, bs * num_kv_heads * num_splits, num_sms, k_buf.element_size())
        if one_launch_enabled():
            launch = replace(launch, one_launch=True)
    one = launch.one_launch and (num_splits == 1 or arrivals is not None)
    if one and num_splits > 1 and (arrivals.dtype != torch.int32 or arrivals.numel() < bs * num_kv_heads):
        raise ValueError(f"decode_attention: arrivals must be int32 with >= {bs * num_kv_heads} entries")
    block_s = max(2, triton.next_power_of_2(num_splits))
    _decode_stage1_kernel[(bs, num_kv_heads, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse, out,
        arrivals if arrivals is not None else seq_lens, sm_scale,
        q.stride(0), q.stride(1), *cache_strides(k_buf, v_buf, req_to_token),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        KV_GROUP=group, HEAD_DIM=head_dim, NUM_SPLITS=num_splits, BLOCK_H=block_h, BLOCK_N=launch.block_n,
        BLOCK_D=block_d, BLOCK_S=block_s, IEEE=ieee, FP32_PV=reduce_in_fp32, ONE_LAUNCH=one,
        num_warps=launch.num_warps, num_stages=launch.num_stages, **pdl.launch_kwargs(q.device),
    )  # fmt: skip
    if one:
        return
    _decode_stage2_kernel[(bs, num_heads)](
        mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_splits, BLOCK_S=block_s, BLOCK_D=block_d,
        num_warps=4 if block_d <= 128 else 8, **pdl.launch_kwargs(q.device),
    )  # fmt: skip
