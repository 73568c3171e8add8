"""The grouped expert GEMMs over rows aligned by expert (`align.py`), on the tensor cores.

- `gate_up_silu`: act[row] = silu(x[token] @ gate_e^T) * (x[token] @ up_e^T), one program per (block of
  BLOCK_M rows of expert e, BLOCK_N columns of the intermediate dimension): the gate and up halves of
  `w13` are read by the same program into two accumulators, so SiLU-and-mul runs in the epilogue and the
  [rows, 2I] gate|up tensor never goes to memory.
- `down`: per_pair[pair] = weight[pair] * act[row] @ down_e^T, written at the pair's own row, float32;
- `sum_pairs`: each token's k rows added in float32 (rows of remote experts skipped), in x's dtype. No
  atomics anywhere, so results do not depend on scheduling.

Rows of padding (sorted id == num_pairs) are neither read nor written; blocks owned by no expert return.
FP8 expert weights (W8A16) are read as e4m3 and multiplied in x's dtype, each K tile's partial product
scaled by its per-channel or block scales: half the weight bytes of bf16.

With `pairs` alignment (small batches: `align.pairs_as_blocks`) each program takes one routed pair
as row 0 of its tile: no grouping launch, and each routed expert's rows are read once per pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import pdl
from tokenspeed.runtime.moe.kernels.align import ExpertAlignment

# FP8 expert weights' scales: ([E, N, 1] per channel, or [E, N / bn, K / bk] with block (bn, bk), None)
WeightScale = tuple[torch.Tensor, "tuple[int, int] | None"]


@triton.jit
def _tile_rows(Sorted, BlockExpert, num_pairs, PAIRS: tl.constexpr, BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    """(expert, pair ids, rows, valid) of this program's tile of BLOCK_M aligned rows: `rows` index the
    activations, `ids` the routed pairs, `valid` the rows that hold one (not padding). Under PDL
    (kernels/pdl.py) it first waits for the kernels before it: the ids and the activations are theirs."""
    pdl.release(PDL)
    pdl.wait(PDL)
    pid_m = tl.program_id(0)
    if PAIRS:
        # one routed pair per program, in row 0 of the tile; act is indexed by pair
        e = tl.load(Sorted + pid_m)
        ids = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs)
        rows = ids
    else:
        e = tl.load(BlockExpert + pid_m)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        ids = tl.load(Sorted + rows)
    return e, ids, rows, ids < num_pairs


@triton.jit
def _load_rows(ptr, valid, kmask, EVEN_K: tl.constexpr):
    """[BLOCK_M, BLOCK_K] activations; rows not `valid` and K past the end (`kmask`) read as 0."""
    if EVEN_K:
        a = tl.load(ptr, mask=valid[:, None], other=0.0)
    else:
        a = tl.load(ptr, mask=valid[:, None] & kmask[None, :], other=0.0)
    return a


@triton.jit
def _load_weights(ptr, nmask, kmask, EVEN_K: tl.constexpr):
    """[BLOCK_K, BLOCK_N] expert weights; columns past N (`nmask`) and K past the end read as 0."""
    if EVEN_K:
        b = tl.load(ptr, mask=nmask[None, :], other=0.0)
    else:
        b = tl.load(ptr, mask=nmask[None, :] & kmask[:, None], other=0.0)
    return b


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b in float32; IEEE for float32 inputs (no TF32 rounding)."""
    if IEEE:
        d = tl.dot(a, b, input_precision="ieee")
    else:
        d = tl.dot(a, b)
    return d


@triton.jit
def _gate_up_silu_kernel(
    X, W, Act, Sorted, BlockExpert, num_pairs, num_experts, INTER, K,
    stride_xm, stride_we, stride_wn, stride_am,
    S, stride_se, stride_sn, stride_sk,  # FP8 weights' scales (HAS_SCALE), in blocks of (GN, GK)
    TOP_K: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr = False, GN: tl.constexpr = 1, GK: tl.constexpr = 1, PDL: tl.constexpr = False,
):  # fmt: skip
    e, ids, rows, valid = _tile_rows(Sorted, BlockExpert, num_pairs, PAIRS, BLOCK_M, PDL)
    if (e >= 0) & (e < num_experts):
        tok = (ids // TOP_K).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        offs_k = tl.arange(0, BLOCK_K)
        a_ptr = X + tok[:, None] * stride_xm + offs_k[None, :]
        g_ptr = W + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        u_ptr = g_ptr + INTER * stride_wn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kmask = offs_k + k0 < K
            a = _load_rows(a_ptr, valid, kmask, EVEN_K)
            g = _load_weights(g_ptr, nmask, kmask, EVEN_K)
            u = _load_weights(u_ptr, nmask, kmask, EVEN_K)
            if HAS_SCALE:
                # FP8 weights (W8A16): the tile in x's dtype, its scales (per channel, or of the K block
                # the tile lies in) applied to the tile's partial product
                s_row = S + e.to(tl.int64) * stride_se + (k0 // GK) * stride_sk
                sg = tl.load(s_row + (offs_n // GN) * stride_sn, mask=nmask, other=0.0)
                su = tl.load(s_row + ((INTER + offs_n) // GN) * stride_sn, mask=nmask, other=0.0)
                acc_g += _dot(a, g.to(a.dtype), IEEE) * sg[None, :]
                acc_u += _dot(a, u.to(a.dtype), IEEE) * su[None, :]
            else:
                acc_g += _dot(a, g, IEEE)
                acc_u += _dot(a, u, IEEE)
            a_ptr += BLOCK_K
            g_ptr += BLOCK_K
            u_ptr += BLOCK_K
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        out = Act + rows[:, None].to(tl.int64) * stride_am + offs_n[None, :]
        tl.store(out, h.to(Act.dtype.element_ty), mask=valid[:, None] & nmask[None, :])


@triton.jit
def _down_kernel(
    Act, W, Out, Sorted, BlockExpert, Weights, num_pairs, num_experts, N, K,
    stride_am, stride_we, stride_wn, stride_om,
    S, stride_se, stride_sn, stride_sk,  # FP8 weights' scales (HAS_SCALE), in blocks of (GN, GK)
    IEEE: tl.constexpr, EVEN_K: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr = False, GN: tl.constexpr = 1, GK: tl.constexpr = 1, PDL: tl.constexpr = False,
):  # fmt: skip
    e, ids, rows, valid = _tile_rows(Sorted, BlockExpert, num_pairs, PAIRS, BLOCK_M, PDL)
    if (e >= 0) & (e < num_experts):
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptr = Act + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        b_ptr = W + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kmask = offs_k + k0 < K
            a = _load_rows(a_ptr, valid, kmask, EVEN_K)
            b = _load_weights(b_ptr, nmask, kmask, EVEN_K)
            if HAS_SCALE:
                sb = tl.load(
                    S + e.to(tl.int64) * stride_se + (k0 // GK) * stride_sk + (offs_n // GN) * stride_sn,
                    mask=nmask,
                    other=0.0,
                )
                acc += _dot(a, b.to(a.dtype), IEEE) * sb[None, :]
            else:
                acc += _dot(a, b, IEEE)
            a_ptr += BLOCK_K
            b_ptr += BLOCK_K
        w = tl.load(Weights + ids, mask=valid, other=0.0)
        acc = acc * w[:, None]
        out = Out + ids[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(out, acc, mask=valid[:, None] & nmask[None, :])


@triton.jit
def _sum_pairs_kernel(
    PerPair, Ids, Out, N, stride_p, stride_o, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False
):  # fmt: skip
    pdl.release(PDL)
    pdl.wait(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        p = t.to(tl.int64) * TOP_K + j
        e = tl.load(Ids + p)
        acc += tl.load(PerPair + p * stride_p + offs, mask=mask & (e >= 0), other=0.0)
    tl.store(Out + t.to(tl.int64) * stride_o + offs, acc.to(Out.dtype.element_ty), mask=mask)


def scale_args(w: torch.Tensor, scale: WeightScale | None, bk: int) -> tuple[tuple, dict, int]:
    """(pointer and strides, constexprs, K tile) of FP8 weights' scales for a grouped GEMM; none for
    weights in x's dtype. A K tile never straddles two scale blocks (the tile shrinks to the block)."""
    if scale is None:
        return (w, 0, 0, 0), {}, bk
    s, block = scale
    if block is None:  # per channel [E, N, 1]
        return (s, s.stride(0), s.stride(1), 0), dict(HAS_SCALE=True, GN=1, GK=1), bk
    gn, gk = block
    return (s, s.stride(0), s.stride(1), s.stride(2)), dict(HAS_SCALE=True, GN=gn, GK=gk), min(bk, gk)


def _tiling(
    w: torch.Tensor,
    scale: WeightScale | None,
    al: ExpertAlignment,
    n: int,
    ieee: bool,
    tile: tuple[int, int],
    cfg,
) -> tuple[tuple, tuple, dict]:
    """(grid, scales' arguments, constexprs and launch options) of a grouped GEMM over `n` output
    columns of w [E, *, K]: `tile` (BLOCK_N, BLOCK_K) from the tuned config, 32x32 for float32 inputs."""
    bn, bk = (32, 32) if ieee else tile
    s_args, s_consts, bk = scale_args(w, scale, bk)
    meta = dict(
        IEEE=ieee,
        EVEN_K=w.shape[2] % bk == 0,
        PAIRS=al.pairs,
        BLOCK_M=al.block_m,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=4 if ieee else cfg.num_warps,
        num_stages=2 if ieee else cfg.num_stages,
        **s_consts,
        **pdl.launch_kwargs(w.device),
    )
    return (al.num_blocks, triton.cdiv(n, bn)), s_args, meta


def gate_up_silu(
    x: torch.Tensor, w13: torch.Tensor, al: ExpertAlignment, top_k: int, cfg, scale: WeightScale | None = None
) -> torch.Tensor:
    """[rows, I] SiLU(gate) * up per aligned row (per pair with `al.pairs`; padding rows unwritten).
    `scale`: (scales, block) of FP8 `w13`."""
    num_experts, two_i, k_in = w13.shape
    inter = two_i // 2
    rows = al.num_pairs if al.pairs else al.sorted_ids.numel()
    act = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    ieee = x.dtype == torch.float32
    grid, s_args, meta = _tiling(w13, scale, al, inter, ieee, (cfg.block_n, cfg.block_k), cfg)
    _gate_up_silu_kernel[grid](
        x, w13, act, al.sorted_ids, al.block_expert, al.num_pairs, num_experts, inter, k_in,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), *s_args, TOP_K=top_k, **meta,
    )  # fmt: skip
    return act


def down(
    act: torch.Tensor,
    w2: torch.Tensor,
    al: ExpertAlignment,
    weights: torch.Tensor,
    cfg,
    scale: WeightScale | None = None,
) -> torch.Tensor:
    """[num_pairs, H] float32: each valid pair's expert output scaled by its routing weight.
    `scale`: (scales, block) of FP8 `w2`."""
    num_experts, n_out, k_in = w2.shape
    out = torch.empty((al.num_pairs, n_out), dtype=torch.float32, device=act.device)
    ieee = act.dtype == torch.float32
    grid, s_args, meta = _tiling(w2, scale, al, n_out, ieee, (cfg.down_block_n, cfg.down_block_k), cfg)
    _down_kernel[grid](
        act, w2, out, al.sorted_ids, al.block_expert, weights, al.num_pairs, num_experts, n_out, k_in,
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), *s_args, **meta,
    )  # fmt: skip
    return out


def sum_pairs(per_pair: torch.Tensor, ids: torch.Tensor, out_dtype) -> torch.Tensor:
    """[T * k, H] -> [T, H]: each token's k rows summed (rows of ids < 0 skipped), in float32."""
    t, top_k = ids.shape
    n = per_pair.shape[1]
    out = torch.empty((t, n), dtype=out_dtype, device=per_pair.device)
    block = min(1024, triton.next_power_of_2(n))
    _sum_pairs_kernel[(t, triton.cdiv(n, block))](
        per_pair, ids, out, n, per_pair.stride(0), out.stride(0), TOP_K=top_k, BLOCK_N=block, num_warps=4,
        **pdl.launch_kwargs(per_pair.device),
    )  # fmt: skip
    return out
