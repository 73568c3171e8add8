"""Dense GEMV for decode batches of 1-4 rows: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias), w in bf16/fp16.

At batch 1 a decode step is a pass over the weights, and cuBLAS reads them at ~4.1 TB/s on the H200 (0.86
of the 4.8 TB/s HBM3e); its small-N GEMVs (o_proj 4096x4096) run far below that. This kernel streams each
weight row once, row-major [N, K], in 16-byte vector loads, with these choices for the autotuner:

- each program holds BLOCK_N rows and walks K in BLOCK_K chunks, multiplying on the CUDA cores into a
  float32 accumulator of the tile's shape per batch row: no reduction across threads inside the K loop
  (one at the end), so the loop is loads and FMAs only. The batch row is read as a tile of the weight
  tile's shape (the same register layout, so no shuffle through shared memory per chunk; the repeats
  are L1 hits);
- PREFETCH chunks ahead are loaded before the current one is multiplied (1 or 2): a short K loop is
  latency-bound without it (the FP8 GEMV's o_proj ran at half the copy bandwidth before it had this);
- split-K (`gemv_common`) for layers narrow enough that the grid alone cannot keep ~5 MB of loads in
  flight on 132 SMs (qkv, o, down of Llama-3.1-8B). Each split stores its float32 partials and counts its
  arrival on an int32 per output block (`kernels/graph_scratch.py`'s `ArrivalCounts`, which every launch
  leaves at zero); the last to arrive adds them in split order, adds the bias and writes the output. One
  launch, the same bits every run: float32 atomics into a zeroed buffer needed a zeroing launch and a
  cast after it, three graph nodes where a 4096 x 4096 product takes about 11 us, and their sum order
  changed from run to run.
Configs whose accumulators would not fit the registers next to the loads in flight are pruned per batch
bucket (1, 2, 4 rows: a batch of 3 runs the 4-row kernel with its last row masked).

`triton.autotune` picks a config at a shape's first call, keyed on (N, K, batch bucket, output dtype),
unless the caller passes one: `layers/dense_gemv.py` passes the configuration the GPU's tuned table ships
for the shape and bucket (the same one in every process, so the same bits at every start).
The CUDA-graph runner makes an eager warm-up forward for every captured batch size before it captures,
so tuning (which synchronizes) never happens inside a capture; a captured call is zero (split-K only),
one launch, with its buffers from the graph's pool. On Hopper (unless TOKENSPEED_PDL=0) a
call with a configuration launches with programmatic dependent launch (`kernels/pdl.py`): its first weight
chunks load while the kernel before it finishes.

Imported only by `layers/dense_gemv.py` on CUDA tensors (and by Triton's interpreter in the CPU tests).
On the GPU tests/gpu/test_bf16_gemv_gpu.py checks it and benchmarks/bf16_gemv.py times it (H200: docs/GPU.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import gemv_common, pdl
from tokenspeed.runtime.kernels.gemv_common import autotune_kwargs, load_rows, split_k_share

# Batches up to this many rows take the GEMV: beyond, the CUDA cores' FMAs per weight byte start to bound
# it and cuBLAS's tensor-core GEMM is as fast.
GEMV_MAX_M = 4
# Split-K is timed for layers of fewer rows than this per SM: 64 x 132 = 8448 takes qkv (6144), o and
# down (4096) of Llama-3.1-8B, at 4-row tiles fewer than ~12 programs an SM.
SPLIT_ROWS_PER_SM = 64
# float32 accumulator values a thread may hold (elements of its tile share x batch rows)
MAX_ACC_PER_THREAD = 64


@dataclass(frozen=True)
class DenseGemvConfig:
    """One launch configuration (also what the tests force, config by config)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1  # the PREFETCH loads are the pipeline; Triton's own stays off
    split_k: int = 1
    prefetch: int = 1  # K chunks loaded ahead of the one being multiplied (0, 1 or 2)

    @property
    def per_thread(self) -> int:
        """Weight elements of a tile each thread holds (and accumulators per batch row)."""
        return self.block_n * self.block_k // (32 * self.num_warps)

    def to_table(self) -> dict[str, int]:
        """The configuration as a tuned table names it (`gemv_table.CONFIG_FIELDS`)."""
        return dict(
            BLOCK_N=self.block_n, BLOCK_K=self.block_k, SPLIT_K=self.split_k, PREFETCH=self.prefetch,
            num_warps=self.num_warps, num_stages=self.num_stages,
        )  # fmt: skip

    @classmethod
    def from_table(cls, cfg: Mapping[str, int]) -> DenseGemvConfig:
        return cls(
            block_n=cfg["BLOCK_N"], block_k=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], split_k=cfg["SPLIT_K"], prefetch=cfg["PREFETCH"],
        )  # fmt: skip

    def triton_config(self) -> triton.Config:
        kwargs = dict(
            BLOCK_N=self.block_n, BLOCK_K=self.block_k, SPLIT_K=self.split_k, PREFETCH=self.prefetch
        )
        return triton.Config(kwargs, num_warps=self.num_warps, num_stages=self.num_stages)


# Bytes in flight per thread = per_thread x 2 x PREFETCH; registers ~ per_thread x (batch rows + 1).
# The tuner picks per shape; `candidates` drops those a bucket cannot hold.
CONFIGS = [
    DenseGemvConfig(4, 256, 4, prefetch=2),  # 8 a thread, two chunks ahead: 4-row batches
    DenseGemvConfig(8, 256, 8, prefetch=2),
    DenseGemvConfig(4, 512, 4),  # 16 a thread
    DenseGemvConfig(8, 256, 4),
    DenseGemvConfig(16, 256, 8),
    DenseGemvConfig(4, 512, 4, prefetch=2),
    DenseGemvConfig(8, 512, 4),  # 32 a thread: batches of 1-2
    DenseGemvConfig(4, 1024, 4),
    DenseGemvConfig(4, 512, 4, num_stages=3, prefetch=0),  # Triton's pipeliner instead
    DenseGemvConfig(8, 512, 4, num_stages=2, prefetch=0),
    DenseGemvConfig(4, 512, 4, split_k=2),
    DenseGemvConfig(4, 512, 4, split_k=4),
    DenseGemvConfig(4, 256, 4, split_k=4, prefetch=2),
    DenseGemvConfig(8, 256, 4, split_k=2),
]


def m_bucket(m: int) -> int:
    """The batch rows a kernel is compiled for: 1, 2 or 4."""
    return 1 if m == 1 else 2 if m == 2 else 4


def fits(cfg: DenseGemvConfig, bucket: int) -> bool:
    """Whether `cfg`'s accumulators (per_thread per batch row) fit beside its loads in flight."""
    return cfg.per_thread * bucket <= MAX_ACC_PER_THREAD


def candidates(bucket: int, allow_split: bool) -> list[DenseGemvConfig]:
    """The configs the autotuner times for a batch bucket (split-K ones only for narrow layers)."""
    return [c for c in CONFIGS if fits(c, bucket) and (allow_split or c.split_k == 1)]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    allow_split = gemv_common.split_allowed(named_args["N"], named_args["X"].device, SPLIT_ROWS_PER_SM)
    return [cfg.triton_config() for cfg in candidates(kwargs["BLOCK_M"], allow_split)]


@triton.jit
def _fma_row(acc, wf, X, row, stride_xm, kk, K, EVEN_K: tl.constexpr):
    # the batch row as a [BLOCK_N, BLOCK_K] tile: the weight tile's layout, so no per-chunk layout change
    if EVEN_K:
        x = tl.load(X + row * stride_xm + kk)
    else:
        x = tl.load(X + row * stride_xm + kk, mask=kk < K, other=0.0)
    return acc + wf * x.to(tl.float32)


@triton.jit
def _store_row(
    acc, j, offs_n, nmask, pid_k, M, N, Bias, Out, Part, stride_om,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    y = tl.sum(acc, axis=1)  # the one reduction across threads, after the K loop
    mask = nmask & (offs_n * 0 + j < M)  # a padded batch row (3 rows in the 4-row kernel) is not stored
    if SPLIT_K == 1:
        if HAS_BIAS:
            y += tl.load(Bias + offs_n, mask=mask, other=0.0).to(tl.float32)
        tl.store(Out + j * stride_om + offs_n.to(tl.int64), y.to(Out.dtype.element_ty), mask=mask)
    else:  # this split's float32 partial, [SPLIT_K, M, N]: `_merge_row` adds them
        tl.store(Part + (pid_k.to(tl.int64) * M + j) * N + offs_n, y, mask=mask)


@triton.jit
def _merge_row(
    j, offs_n, nmask, M, N, Bias, Out, Part, stride_om, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr
):  # fmt: skip
    # the last split to arrive: batch row j's partials added in split order (read past the L1, where the
    # other programs' stores are not), the bias, the cast
    mask = nmask & (offs_n * 0 + j < M)
    part = Part + j * N + offs_n.to(tl.int64)
    y = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        y += tl.load(part + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
    if HAS_BIAS:
        y += tl.load(Bias + offs_n, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + j * stride_om + offs_n.to(tl.int64), y.to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _dense_gemv_kernel(
    X, W, Bias, Out, Part, Arrivals, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pid_k, offs_n, nmask, chunks, lo, hi = split_k_share(N, K, BLOCK_N, BLOCK_K, SPLIT_K)
    offs_k = tl.arange(0, BLOCK_K)
    last = tl.maximum(hi - 1, 0)  # prefetched chunk indices are clamped to it: a repeat comes from cache
    w_rows = W + offs_n[:, None].to(tl.int64) * stride_wn
    # one accumulator per batch row; rows past M repeat row M - 1 (in bounds; their results are not stored)
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if BLOCK_M > 1:
        row1 = tl.minimum(M - 1, 1)
        acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if BLOCK_M > 2:
        row2 = tl.minimum(M - 1, 2)
        row3 = tl.minimum(M - 1, 3)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if PREFETCH >= 1:
        w1 = load_rows(w_rows, tl.minimum(lo, last) * BLOCK_K + offs_k, K, nmask, EVEN_K, EVEN_N)
    if PREFETCH >= 2:
        w2 = load_rows(w_rows, tl.minimum(lo + 1, last) * BLOCK_K + offs_k, K, nmask, EVEN_K, EVEN_N)
    # Under PDL the weight chunks above load while the previous kernel finishes; X is its output.
    pdl.release(PDL)
    pdl.wait(PDL)
    for i in range(lo, hi):
        k = i * BLOCK_K + offs_k
        if PREFETCH == 0:
            w = load_rows(w_rows, k, K, nmask, EVEN_K, EVEN_N)
        elif PREFETCH == 1:
            w = w1
            w1 = load_rows(w_rows, tl.minimum(i + 1, last) * BLOCK_K + offs_k, K, nmask, EVEN_K, EVEN_N)
        else:
            w = w1
            w1 = w2
            w2 = load_rows(w_rows, tl.minimum(i + 2, last) * BLOCK_K + offs_k, K, nmask, EVEN_K, EVEN_N)
        wf = w.to(tl.float32)
        kk = tl.broadcast_to(k[None, :], [BLOCK_N, BLOCK_K])
        acc0 = _fma_row(acc0, wf, X, 0, stride_xm, kk, K, EVEN_K)
        if BLOCK_M > 1:
            acc1 = _fma_row(acc1, wf, X, row1, stride_xm, kk, K, EVEN_K)
        if BLOCK_M > 2:
            acc2 = _fma_row(acc2, wf, X, row2, stride_xm, kk, K, EVEN_K)
            acc3 = _fma_row(acc3, wf, X, row3, stride_xm, kk, K, EVEN_K)
    _store_row(acc0, 0, offs_n, nmask, pid_k, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
    if BLOCK_M > 1:
        _store_row(acc1, 1, offs_n, nmask, pid_k, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
    if BLOCK_M > 2:
        _store_row(acc2, 2, offs_n, nmask, pid_k, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
        _store_row(acc3, 3, offs_n, nmask, pid_k, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
    if SPLIT_K > 1:
        tl.debug_barrier()  # every thread's partials are stored before the arrival is counted
        slot = Arrivals + tl.program_id(0)
        arrived = tl.atomic_add(slot, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            _merge_row(0, offs_n, nmask, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
            if BLOCK_M > 1:
                _merge_row(1, offs_n, nmask, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
            if BLOCK_M > 2:
                _merge_row(2, offs_n, nmask, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
                _merge_row(3, offs_n, nmask, M, N, Bias, Out, Part, stride_om, HAS_BIAS, SPLIT_K)
            tl.store(slot, 0)  # ready for the next launch


# K and N without a tail skip the masks (all Llama-3.1-8B shapes).
_launch = triton.heuristics(
    {
        "EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0,
        "EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
    }
)(_dense_gemv_kernel)

_tuned = triton.autotune(
    configs=[c.triton_config() for c in CONFIGS],
    key=["N", "K", "BLOCK_M", "HAS_BIAS"],  # the autotuner adds the tensors' dtypes (bf16 / fp32 out)
    prune_configs_by={"early_config_prune": _prune},
    **autotune_kwargs(),
)(_launch)


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `dense_gemv` takes x [M, K] times w [N, K]: 1..GEMV_MAX_M rows, bf16/fp16 in both, the
    weight row-major."""
    return 1 <= x.shape[0] <= GEMV_MAX_M and gemv_common.row_major_16bit(x, w)


def arrival_tiles(n: int, device: torch.device, config: DenseGemvConfig | None = None) -> int:
    """The arrival counts a launch of `n` output rows on `device` needs: one per block of BLOCK_N rows, for
    `config` (or, autotuning, for the narrowest block any configuration has); 0 when it cannot split K."""
    if config is not None:
        return -(-n // config.block_n) if config.split_k > 1 else 0
    if not gemv_common.split_allowed(n, device, SPLIT_ROWS_PER_SM):
        return 0
    return -(-n // min(c.block_n for c in CONFIGS))


def dense_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: DenseGemvConfig | None = None,
    arrivals: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] times w [N, K] (+ bias [N]) -> [M, N] in `out_dtype` (default x's; float32 for logits
    saves the cast). `config` forces one launch configuration (a tuned table's, or a test's); by default the
    autotuner picks. `arrivals`: int32 zeros of at least `arrival_tiles(N, device, config)` that a split-K launch
    counts in and leaves at zero (`layers/dense_gemv.py` keeps one for every layer); without it a call that
    may split K zeroes counts of its own."""
    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    bucket = m_bucket(m)
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    allow_split = gemv_common.split_allowed(n, x.device, SPLIT_ROWS_PER_SM)
    if config is not None:
        allow_split = config.split_k > 1
    part = counts = out  # valid pointers a launch that does not split K never reads
    if allow_split:
        splits = config.split_k if config is not None else max(c.split_k for c in CONFIGS)
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        need = arrival_tiles(n, x.device, config)
        if arrivals is None:
            counts = torch.zeros(need, dtype=torch.int32, device=x.device)
        elif arrivals.dtype != torch.int32 or arrivals.numel() < need:
            raise ValueError(f"dense_gemv: arrivals must be int32 with >= {need} entries")
        else:
            counts = arrivals
    args = (x, w, bias if bias is not None else w, out, part, counts, m, n, k, x.stride(0), w.stride(0),
            out.stride(0))  # fmt: skip
    meta = dict(HAS_BIAS=bias is not None, BLOCK_M=bucket)
    if config is None:
        _tuned[lambda a: (triton.cdiv(n, a["BLOCK_N"]), a["SPLIT_K"])](*args, **meta)
    else:
        _launch[(triton.cdiv(n, config.block_n), config.split_k)](
            *args, **meta, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=config.split_k,
            PREFETCH=config.prefetch, num_warps=config.num_warps, num_stages=config.num_stages,
            **pdl.launch_kwargs(x.device),
        )  # fmt: skip
    return out
