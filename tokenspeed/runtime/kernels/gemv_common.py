"""What the Triton GEMVs of decode-sized batches share (`fp8_gemv.py`, `bf16_gemv.py`): whether split-K is
worth trying for a layer's width, the operands a 16-bit product takes (`skinny_gemm.py` checks them too),
the autotuner's short timing runs, a program's share of the work and the weight-tile load.

Split-K: with few output rows a grid has too few programs to keep the H200's 132 SMs' loads in flight, so
programs also split K. Both GEMVs merge the splits in the launch: each split stores its float32 partials
and counts its arrival on an int32 per output block (`kernels/graph_scratch.py`), and the last to arrive
adds them in split order and writes the output. What the tuner times is then what a call costs, one
launch, with the same bits on every run.

Imported only where a GEMV runs on a CUDA tensor (and by Triton's interpreter in the CPU tests).
"""

from __future__ import annotations

import functools
import inspect

import torch
import triton
import triton.language as tl

H200_SMS = 132  # what the CPU interpreter's pruning assumes


def sm_count(device: torch.device) -> int:
    return (
        torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else H200_SMS
    )


def row_major_16bit(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether x [M, K] and w [N, K] are the operands a 16-bit product kernel here takes (this GEMV's, and
    `skinny_gemm.py`'s): both bf16 or both fp16, two-dimensional, the weight row-major, K the same."""
    return (
        x.dim() == 2
        and x.dtype == w.dtype
        and w.dtype in (torch.bfloat16, torch.float16)
        and w.dim() == 2
        and w.stride(1) == 1
        and x.shape[1] == w.shape[1]
    )


def split_allowed(n: int, device: torch.device, rows_per_sm: int) -> bool:
    """Whether split-K configs are timed for a layer of `n` output rows: fewer than `rows_per_sm` rows an
    SM leaves K as the only parallelism that fills the device (each kernel says what fills an SM)."""
    return n < rows_per_sm * sm_count(device)


def autotune_kwargs() -> dict:
    """Short timing runs (the kernels take microseconds), where this Triton lets us choose them."""
    params = inspect.signature(triton.autotune).parameters
    kwargs = {}
    if "do_bench" in params:
        from triton.testing import do_bench

        kwargs["do_bench"] = functools.partial(do_bench, warmup=5, rep=20)
    return kwargs


@triton.jit
def split_k_share(N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """(split, offs_n, nmask, chunks, lo, hi) of this program: its BLOCK_N output rows (program axis 0)
    and, as K split `split` (axis 1), its share [lo, hi) of the K dimension's `chunks` chunks of BLOCK_K."""
    split = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    chunks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(chunks, SPLIT_K)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, chunks)
    return split, offs_n, nmask, chunks, lo, hi


@triton.jit
def load_rows(rows, k, K, nmask, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """A [rows, BLOCK_K] weight tile streamed once (evict first: it is never read again this step). With
    EVEN_K no K mask, so the loads stay whole 16-byte vectors; with EVEN_N no row mask either."""
    if EVEN_K:
        if EVEN_N:
            w = tl.load(rows + k[None, :], eviction_policy="evict_first")
        else:
            w = tl.load(rows + k[None, :], mask=nmask[:, None], other=0.0, eviction_policy="evict_first")
    else:
        w = tl.load(rows + k[None, :], mask=nmask[:, None] & (k < K)[None, :], other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
    return w
