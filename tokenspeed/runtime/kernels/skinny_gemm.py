"""A bf16/fp16 GEMM for decode batches of 8-128 rows on the tensor cores: y[M, N] = x[M, K] @ w[N, K]^T.

At those batches a decode step's linear layers still read every weight once and little else, so they are
bound by memory bandwidth, and cuBLAS reached 0.82 of the copy bandwidth over the Llama-3.1-8B step's
GEMMs at batch 64 on the H200 (4.35 ms for 15 GB, the kernel profile of results/gpu_decode.json), where the
GEMV of `bf16_gemv.py` reaches 0.84-0.96 at one row. Whether this kernel does better is measured, not
assumed: `benchmarks/skinny_gemm.py` times it against cuBLAS per shape and batch, and the engine calls it
(`layers/dense_gemv.py`) only for the shapes and batches where the GPU's tuned table says it won.

Program (n block, m block, K split) multiplies BLOCK_M x BLOCK_K rows of x by BLOCK_N x BLOCK_K rows of w
over its share of K, the loads pipelined `num_stages` deep. One M block covers the whole batch up to
BLOCK_M rows, so each weight tile is read from memory once. A shape with few N blocks (o: 4096 outputs are
32-64 programs) splits K to fill the GPU: each split writes its float32 partial, counts its arrival on an
int32 per output tile with a GPU-scope acquire-release atomic, and the last to arrive adds the partials
in split order (the same bits whichever arrives last), writes y and sets the count back to zero for the
next launch or graph replay (the pattern of `decode_attention.py`'s one launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import gemv_common, pdl


@dataclass(frozen=True)
class SkinnyGemmConfig:
    block_m: int = 64  # rows a program covers; the batch's rows rounded up to a power of two, >= 16
    block_n: int = 128
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    # multiply w @ x^T, so the weight's BLOCK_N rows are the tensor cores' M side (Hopper's wgmma takes 64
    # rows at least) and the batch's BLOCK_M rows their N side (16 and up): a batch of 8-32 rows then fills
    # an MMA that x's rows alone would leave three quarters empty
    swap_ab: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "split_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"SkinnyGemmConfig.{name} must be a power of two, got {v}")
        if self.block_m < 16 or self.block_n < 16 or self.block_k < 16:
            raise ValueError("SkinnyGemmConfig: the tensor cores take tiles of at least 16 in each dimension")


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `skinny_gemm` takes x [M, K] times w [N, K]: bf16/fp16 in both, the weight row-major."""
    return gemv_common.row_major_16bit(x, w) and x.shape[0] >= 1


def tiles(m: int, n: int, config: SkinnyGemmConfig) -> int:
    """Output tiles of a launch (each with its own arrival count when K is split)."""
    return triton.cdiv(n, config.block_n) * triton.cdiv(m, config.block_m)


def shared_bytes(config: SkinnyGemmConfig, itemsize: int = 2) -> int:
    """The pipeline's shared memory: `num_stages` tiles of x and of w."""
    return config.num_stages * (config.block_m + config.block_n) * config.block_k * itemsize


def candidates(
    m: int, n: int, k: int, num_sms: int = 132, max_shared: int = 160 << 10
) -> list[SkinnyGemmConfig]:
    """The configurations `benchmarks/skinny_gemm.py` times at one shape: tiles of 64 or 128 outputs by 64,
    128 or 256 of K, 3-5 stages within `max_shared` bytes of shared memory (two programs a multiprocessor
    below about 110 KB), the operands swapped for batches of up to 64 rows (and only swapped up to 32), K
    unsplit and split into as many parts (2-8) as fill every multiprocessor once, where that differs and
    leaves each part at least two K tiles. Eight warps for the larger tiles keep the split merge's float32
    tile out of local memory (255 registers and a spill with four, compiled for sm_90)."""
    block_m = max(16, triton.next_power_of_2(min(m, 128)))
    swaps = (True,) if m <= 32 else (False, True) if m <= 64 else (False,)
    out = []
    for swap in swaps:
        for block_n in (64, 128):
            n_tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
            for block_k in (64, 128, 256):
                split, splits = 1, {1}
                while n_tiles * split < num_sms and split < 8 and k // (2 * split * block_k) >= 2:
                    split *= 2
                splits.add(split)
                warps = 4 if block_m * block_n <= 64 * 64 else 8
                for split_k in sorted(splits):
                    if split_k > 1 and block_m * block_n > 64 * 128:
                        continue  # the merge's float32 tile spills even with eight warps
                    for stages in (3, 4, 5):
                        cfg = SkinnyGemmConfig(block_m, block_n, block_k, split_k, warps, stages, swap)
                        if shared_bytes(cfg) <= max_shared:
                            out.append(cfg)
    return out


@triton.jit
def _skinny_gemm_kernel(
    X, W, Y, Part, Arrivals, M, N, K, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.release(PDL)
    pdl.wait(PDL)  # x is the previous kernel's output (kernels/pdl.py)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    # this split's K range, whole BLOCK_K tiles except the last split's end
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_lo = split * per_split * BLOCK_K
    k_hi = tl.minimum(k_lo + per_split * BLOCK_K, K)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = X + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = W + offs_n[:, None].to(tl.int64) * stride_wn
    # the output tile as the tensor cores hold it: [BLOCK_N, BLOCK_M] (y^T) with the operands swapped
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        if EVEN_K:
            x = tl.load(x_rows + kk[None, :], mask=mmask[:, None], other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0, eviction_policy="evict_first")
        else:
            kmask = kk < k_hi
            x = tl.load(x_rows + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                        eviction_policy="evict_first")  # fmt: skip
        if SWAP_AB:
            if IEEE:
                acc += tl.dot(w, tl.trans(x), input_precision="ieee")
            else:
                acc += tl.dot(w, tl.trans(x))
        else:
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
    # element offsets into [M, N] (y and each split's partial) in the accumulator's layout
    if SWAP_AB:
        out_mask = nmask[:, None] & mmask[None, :]
        y_off = offs_m[None, :].to(tl.int64) * stride_ym + offs_n[:, None]
        p_off = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    else:
        out_mask = mmask[:, None] & nmask[None, :]
        y_off = offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        p_off = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(Y + y_off, acc.to(Y.dtype.element_ty), mask=out_mask)
    else:
        # partials [SPLIT_K, M, N] float32; the last split of this tile to arrive adds them in split order
        tl.store(Part + split.to(tl.int64) * M * N + p_off, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
        slot = Arrivals + pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(slot, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.load(Part + p_off, mask=out_mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(Part + s * M * N + p_off, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(Y + y_off, total.to(Y.dtype.element_ty), mask=out_mask)
            tl.store(slot, 0)  # ready for the next launch


def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    config: SkinnyGemmConfig,
    arrivals: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T -> [M, N] in x's dtype (`out` if given). `arrivals`: int32 zeros of at least
    `tiles(M, N, config)` entries, needed when `config.split_k` > 1, left zero again by every launch."""
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or w.stride(-1) != 1:
        raise ValueError(f"skinny_gemm: w must be [N, {k}] contiguous in K, got {tuple(w.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = config.split_k
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, config.block_m), split)
    if split > 1:
        if arrivals is None or arrivals.dtype != torch.int32 or arrivals.numel() < grid[0] * grid[1]:
            raise ValueError(f"skinny_gemm: split_k {split} needs int32 arrivals of >= {grid[0] * grid[1]}")
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    else:
        part = arrivals = out  # valid pointers the unsplit kernel never touches
    _skinny_gemm_kernel[grid](
        x, w, out, part, arrivals, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split,
        EVEN_K=k % (split * config.block_k) == 0, SWAP_AB=config.swap_ab, IEEE=x.dtype == torch.float32,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl.launch_kwargs(x.device),
    )  # fmt: skip
    return out
