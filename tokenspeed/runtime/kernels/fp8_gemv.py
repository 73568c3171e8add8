"""FP8 weight GEMV for decode-sized batches: y[m, n] = scale(n, k) * sum_k x[m, k] * float(w8[n, k]) (+ bias).

The activations stay in their dtype (bf16 as the model runs): no per-token quantization kernels before the
product, and no activation rounding to e4m3, so it is also closer to the float32 reference than the
`torch._scaled_mm` path, which is not built for M = 1. The weight is read once, row-major
[N, K] in e4m3, by programs of BLOCK_N rows that stream K in BLOCK_K-wide vectorized loads and accumulate
in float32. Scales: per channel (`weight_scale` [N, 1], applied once at the end) or block-wise
([ceil(N/bn), ceil(K/bk)] tiles, applied to each K chunk's partial sum, so BLOCK_K never crosses a tile).

Two inner products, picked by the autotuner per shape and batch bucket:
- `reduce`: the w tile [BLOCK_N, BLOCK_K] times each batch row in turn, summed along K on the CUDA cores
  (M = 1..4), optionally loading the next K chunk before multiplying this one (short K loops are
  latency-bound: on the H200 the o_proj GEMV ran at half the copy bandwidth without it);
- `dot`: the weight tile converted to the activations' dtype (e4m3 is exact in bf16/fp16) and `tl.dot`
  against x padded to 16 rows on the tensor cores (M up to 16, where CUDA-core FMAs would bound the time),
  either as x W^T (mma.sync, the converted tile goes through shared memory) or swapped, W x^T with the
  weight as the A operand from registers (wgmma m64n16 on Hopper).
Split-K (when N is small, e.g. `down_proj` N = 4096 with K = 14336): each split stores its float32 partials
and counts its arrival on an int32 per output block, and the last to arrive adds them in split order, adds
the bias and writes the output, in the one launch (as `bf16_gemv.py` does), so what the tuner times is what
a call costs and a split configuration gives the same bits on every run.

A call runs `default_config`: the configuration that won each of Llama-3.1-8B's shapes on the H200, chosen
by the features that separate them. It is fixed rather than autotuned in each process, so every start
computes the same bits (a configuration picked by timing could sum K in another order and flip a greedy
near-tie), and start-up skips the tuning (4.6 s a shape and batch
bucket on the H200). `fp8_gemv(..., autotune=True)` times every candidate instead (`benchmarks/fp8_gemv.py`
compares the two), keyed on (N, K, batch bucket 1 / 4 / 16, scale tiling).

Imported only from `kernels/fp8_gemm.py` on CUDA tensors (and by Triton's interpreter in the CPU tests).
On the GPU tests/gpu/test_fp8_gpu.py checks it and benchmarks/fp8_gemv.py times it (H200: docs/GPU.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import gemv_common, pdl
from tokenspeed.runtime.kernels.gemv_common import autotune_kwargs, load_rows, split_k_share

# Batches up to this many rows take the GEMV; larger ones are compute-bound enough for the GEMM paths.
GEMV_MAX_M = 16
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration (also what the CPU tests force, config by config)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 2
    split_k: int = 1
    use_dot: bool = False
    prefetch: bool = False  # reduce: the next K chunk's load is issued before this one is multiplied
    swap_ab: bool = False  # dot: the converted weight tile is the MMA's A operand (no shared-memory trip)

    def triton_config(self) -> triton.Config:
        kwargs = dict(
            BLOCK_N=self.block_n, BLOCK_K=self.block_k, SPLIT_K=self.split_k, USE_DOT=self.use_dot,
            PREFETCH=self.prefetch, SWAP_AB=self.swap_ab,
        )  # fmt: skip
        return triton.Config(kwargs, num_warps=self.num_warps, num_stages=self.num_stages)


# A handful per path; `candidates` keeps those that fit the batch bucket and the shape. A memory-bound
# kernel needs ~5 MB of loads in flight on an H200: when N is small (4096 rows) only wide K tiles, the
# dot path's pipelined stages or split-K give the grid that much.
REDUCE_CONFIGS = [
    GemvConfig(8, 512, 4),
    GemvConfig(4, 1024, 4),
    GemvConfig(8, 1024, 4),
    GemvConfig(4, 2048, 8),
    GemvConfig(4, 1024, 4, prefetch=True),
    GemvConfig(8, 1024, 4, prefetch=True),
    GemvConfig(4, 2048, 8, prefetch=True),
]
DOT_CONFIGS = [
    GemvConfig(16, 256, 4, 4, use_dot=True),
    GemvConfig(32, 128, 4, 4, use_dot=True),
    GemvConfig(32, 256, 4, 3, use_dot=True),
    GemvConfig(64, 128, 4, 4, use_dot=True),
    GemvConfig(64, 128, 4, 4, use_dot=True, swap_ab=True),
    GemvConfig(64, 256, 4, 3, use_dot=True, swap_ab=True),
    GemvConfig(128, 128, 8, 3, use_dot=True, swap_ab=True),
]
SPLIT_CONFIGS = [
    GemvConfig(16, 256, 4, 4, split_k=2, use_dot=True),
    GemvConfig(16, 256, 4, 4, split_k=4, use_dot=True),
    GemvConfig(8, 512, 4, split_k=2),
    GemvConfig(4, 1024, 4, split_k=2),
    GemvConfig(4, 1024, 4, split_k=4),
    GemvConfig(4, 1024, 4, split_k=2, prefetch=True),
]
ALL_CONFIGS = REDUCE_CONFIGS + DOT_CONFIGS + SPLIT_CONFIGS


def m_bucket(m: int) -> int:
    """The batch bucket a config is tuned for: 1 (a GEMV proper), 2..4, 5..16."""
    return 1 if m == 1 else 4 if m <= 4 else 16


def split_allowed(n: int, device: torch.device) -> bool:
    # Fewer than ~2 programs per SM at the dot path's narrowest tile (16 rows): K is the only parallelism left.
    return gemv_common.split_allowed(n, device, rows_per_sm=32)


def fits(cfg: GemvConfig, bucket: int, block_k: int | None) -> bool:
    """Whether `cfg` suits a batch bucket (a reduce tile keeps <= 64 weight values a thread) and, for
    block-wise scales, tiles of `block_k` columns (a power of two, at least 16)."""
    if not cfg.use_dot:
        if bucket == 16:
            return False  # 16 CUDA-core FMAs per weight element: compute-bound, the dot path's batch
        if cfg.block_n * cfg.block_k > 64 * 32 * cfg.num_warps:
            return False
    return block_k is None or block_k >= 16


def adapt(cfg: GemvConfig, block_k: int | None) -> GemvConfig:
    """With block-wise scales a K chunk must stay inside one scale tile."""
    if block_k is None or cfg.block_k <= block_k:
        return cfg
    return dataclasses.replace(cfg, block_k=block_k)


def candidates(bucket: int, block_k: int | None, allow_split: bool) -> list[GemvConfig]:
    """The configs the autotuner times for a batch bucket and scale layout."""
    out: list[GemvConfig] = []
    for cfg in ALL_CONFIGS:
        if cfg.split_k > 1 and not allow_split:
            continue
        if fits(cfg, bucket, block_k) and (cfg := adapt(cfg, block_k)) not in out:
            out.append(cfg)
    return out


def default_config(bucket: int, n: int, k: int, block_k: int | None) -> GemvConfig:
    """The configuration a call runs. On the H200 (benchmarks/results/gpu_fp8_gemv.json, 2026-12-04 12:51 UTC)
    the autotuner's winners on Llama-3.1-8B's qkv (6144 x 4096), o (4096 x 4096), gate_up (28672 x 4096)
    and down (4096 x 14336) were, per channel: at one row the CUDA-core path with 4 rows a program and
    1024-wide K chunks, 2048-wide on 8 warps for the narrow o; at 4 and 16 rows the tensor-core path with
    32 rows and 256-wide chunks, 128-wide for the wide gate_up; with 128 x 128 scale blocks the tensor-core
    path with 32 rows and 128-wide chunks. None split K. Down's long K took loading ahead at 12:51 (22.08 us),
    but the run of 21:29 UTC timed that at 21.99 us and the plain 1024-wide chunks at 20.27 us."""
    if block_k is not None:
        return adapt(GemvConfig(32, 128, 4, 4, use_dot=True), block_k)
    if bucket == 1:
        return GemvConfig(4, 2048, 8) if n <= 4096 and k < 8192 else GemvConfig(4, 1024, 4)
    return GemvConfig(32, 128, 4, 4, use_dot=True) if n >= 16384 else GemvConfig(32, 256, 4, 3, use_dot=True)


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    # `configs` is ALL_CONFIGS as Triton configs; `candidates` rebuilds them adapted to the layout.
    allow_split = split_allowed(named_args["N"], named_args["X"].device)
    chosen = candidates(kwargs["M_BUCKET"], kwargs["GK"] or None, allow_split)
    return [cfg.triton_config() for cfg in chosen]


@triton.jit
def _epilogue(
    acc, offs_m, offs_n, pid_k, M, N, S, Bias, Out, Part, Arrivals, stride_om, stride_sn,
    GK: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    nmask = offs_n < N
    if GK == 0:  # per-channel: one scale a row, applied once (to each split's partial: a sum scales alike)
        acc = acc * tl.load(S + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
    mask = (offs_m < M)[:, None] & nmask[None, :]
    off = offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc = acc + tl.load(Bias + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(Out + off, acc.to(Out.dtype.element_ty), mask=mask)
    else:
        # this split's partial, [SPLIT_K, M, N] float32; the last split of this block of rows to arrive adds
        # them in split order (read past the L1, where the other programs' stores are not)
        part = Part + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(part + pid_k.to(tl.int64) * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
        slot = Arrivals + tl.program_id(0)
        arrived = tl.atomic_add(slot, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(part + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total = total + tl.load(Bias + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
            tl.store(Out + off, total.to(Out.dtype.element_ty), mask=mask)
            tl.store(slot, 0)  # ready for the next launch


@triton.jit
def _fp8_gemv_kernel(
    X, W, S, Bias, Out, Part, Arrivals, M, N, K, stride_xm, stride_wn, stride_om, stride_sn,
    GN: tl.constexpr, GK: tl.constexpr, HAS_BIAS: tl.constexpr, M_BUCKET: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, USE_DOT: tl.constexpr,
    PREFETCH: tl.constexpr, SWAP_AB: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pid_k, offs_n, nmask, chunks, lo, hi = split_k_share(N, K, BLOCK_N, BLOCK_K, SPLIT_K)
    offs_m = tl.arange(0, BLOCK_M)
    mmask = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = W + offs_n[:, None].to(tl.int64) * stride_wn
    if GK != 0:
        s_rows = S + (offs_n // GN).to(tl.int64) * stride_sn
    if USE_DOT:
        x_rows = X + offs_m[:, None] * stride_xm
        pdl.release(PDL)
        pdl.wait(PDL)  # X is the previous kernel's output (kernels/pdl.py)
        if SWAP_AB:
            acc_t = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for i in range(lo, hi):
            k = i * BLOCK_K + offs_k
            w = load_rows(w_rows, k, K, nmask, EVEN_K, False)
            x = tl.load(x_rows + k[None, :], mask=mmask[:, None] & (k < K)[None, :], other=0.0)
            if X.dtype.element_ty == tl.float32:
                wd = w.to(tl.float32)
            else:
                wd = w.to(X.dtype.element_ty)  # e4m3 -> bf16/fp16 is exact
            if SWAP_AB:  # y^T = W x^T: the weight tile is the MMA's M side, straight from registers
                if X.dtype.element_ty == tl.float32:
                    part_t = tl.dot(wd, tl.trans(x), input_precision="ieee")
                else:
                    part_t = tl.dot(wd, tl.trans(x))
                if GK != 0:  # block-wise: this K chunk lies in one tile column
                    part_t = part_t * tl.load(s_rows + (i * BLOCK_K) // GK, mask=nmask, other=0.0)[:, None]
                acc_t += part_t
            else:
                if X.dtype.element_ty == tl.float32:
                    part = tl.dot(x, tl.trans(wd), input_precision="ieee")
                else:
                    part = tl.dot(x, tl.trans(wd))
                if GK != 0:
                    part = part * tl.load(s_rows + (i * BLOCK_K) // GK, mask=nmask, other=0.0)[None, :]
                acc += part
        if SWAP_AB:
            acc = tl.trans(acc_t)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if PREFETCH:  # chunk indices are clamped into [lo, hi - 1]: a repeated chunk comes from cache
            k0 = tl.minimum(lo, chunks - 1) * BLOCK_K + offs_k
            w_next = load_rows(w_rows, k0, K, nmask, EVEN_K, False)
        # Under PDL the first weight chunk above loads while the previous kernel finishes.
        pdl.release(PDL)
        pdl.wait(PDL)
        for i in range(lo, hi):
            k = i * BLOCK_K + offs_k
            if PREFETCH:
                w = w_next
                k_next = tl.minimum(i + 1, hi - 1) * BLOCK_K + offs_k
                w_next = load_rows(w_rows, k_next, K, nmask, EVEN_K, False)
            else:
                w = load_rows(w_rows, k, K, nmask, EVEN_K, False)
            # one weight row-chunk times each batch row, summed along K: a 2-D product keeps the weight
            # load in 16-byte vectors (a 3-D broadcast over M made Triton split it into 4-byte loads)
            wf = w.to(tl.float32)
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for j in tl.static_range(BLOCK_M):
                xj = tl.load(X + tl.minimum(j, M - 1) * stride_xm + k, mask=k < K, other=0.0)
                pj = tl.sum(wf * xj.to(tl.float32)[None, :], axis=1)
                part += tl.where(offs_m[:, None] == j, pj[None, :], 0.0)
            if GK != 0:  # block-wise: this K chunk lies in one tile column
                part = part * tl.load(s_rows + (i * BLOCK_K) // GK, mask=nmask, other=0.0)[None, :]
            acc += part
    _epilogue(
        acc, offs_m, offs_n, pid_k, M, N, S, Bias, Out, Part, Arrivals, stride_om, stride_sn, GK, HAS_BIAS,
        SPLIT_K,
    )  # fmt: skip


# The dot path pads the batch to 16 rows (the tensor cores' smallest M); K chunks without a tail skip the mask.
_launch = triton.heuristics(
    {
        "BLOCK_M": lambda a: 16 if a["USE_DOT"] else a["M_BUCKET"],
        "EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0,
    }
)(_fp8_gemv_kernel)


_tuned = triton.autotune(
    configs=[c.triton_config() for c in ALL_CONFIGS],
    key=["N", "K", "M_BUCKET", "GK", "GN"],
    prune_configs_by={"early_config_prune": _prune},
    **autotune_kwargs(),
)(_launch)


def supported(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int] | None) -> bool:
    """Whether `fp8_gemv` takes this product: a decode-sized batch, a row-major weight, scales laid out as
    `fp8_math` says, and block tiles whose K side is a power of two of at least 16 (a K chunk must stay
    inside one tile)."""
    m = x.shape[0]
    if not 1 <= m <= GEMV_MAX_M or x.dtype not in _DTYPES or w.stride(1) != 1 or w_scale.dim() != 2:
        return False
    if block is None:
        return w_scale.shape[0] == w.shape[0]
    return w_scale.stride(1) == 1 and block[1] >= 16 and block[1] & (block[1] - 1) == 0


def fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int] | None,
    bias: torch.Tensor | None,
    config: GemvConfig | None = None,
    autotune: bool = False,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32, M <= GEMV_MAX_M) times e4m3 w [N, K] with its scales -> [M, N] in x's
    dtype, with `config` (tests force each candidate) or `default_config`. `autotune` runs the
    configuration `triton.autotune` times best among the candidates instead, at each shape's first call in
    this process (`benchmarks/fp8_gemv.py` measures the default against it)."""
    m, k = x.shape
    if config is None and not autotune:
        config = default_config(m_bucket(m), w.shape[0], k, block[1] if block is not None else None)
    return _run(x, w, w_scale, block, bias, config)


def _run(x, w, w_scale, block, bias, config: GemvConfig | None) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    gn, gk = block if block is not None else (1, 0)
    bucket = m_bucket(m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    # float32 partials and arrival counts for the split-K configs the autotuner may time, or the forced one
    # if it splits (no configuration `default_config` gives does); valid pointers a launch never reads else
    cfg = adapt(config, gk or None) if config is not None else None
    splits = cfg.split_k if cfg is not None else max(c.split_k for c in SPLIT_CONFIGS)
    part = counts = out
    if (cfg is None and split_allowed(n, x.device)) or (cfg is not None and cfg.split_k > 1):
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        narrowest = cfg.block_n if cfg is not None else min(c.block_n for c in SPLIT_CONFIGS)
        counts = torch.zeros(triton.cdiv(n, narrowest), dtype=torch.int32, device=x.device)
    args = (x, w, w_scale, bias if bias is not None else w_scale, out, part, counts, m, n, k,
            x.stride(0), w.stride(0), out.stride(0), w_scale.stride(0))  # fmt: skip
    meta = dict(GN=gn, GK=gk, HAS_BIAS=bias is not None, M_BUCKET=bucket)
    if cfg is None:
        _tuned[lambda a: (triton.cdiv(n, a["BLOCK_N"]), a["SPLIT_K"])](*args, **meta)
    else:
        _launch[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
            *args, **meta, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, USE_DOT=cfg.use_dot,
            PREFETCH=cfg.prefetch, SWAP_AB=cfg.swap_ab, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **pdl.launch_kwargs(x.device),
        )  # fmt: skip
    return out
