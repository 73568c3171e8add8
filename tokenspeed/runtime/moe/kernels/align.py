"""Grouping (token, expert) pairs by expert into blocks of BLOCK_M rows, in one launch.

The grouped GEMMs (`gemm.py`) give each program BLOCK_M rows that all use one expert's weights.
Here the n = T * k routed pairs are laid out so: expert e gets rows [start_e, start_e + pad_e) where
pad_e is its pair count rounded up to BLOCK_M; `sorted_ids[row]` is the flat pair index (token * k +
slot) of each row, `n` for padding rows; `block_expert[b]` is the expert of block b, or E for blocks past
the last expert's (their programs return at once).

A single program does it all (the pair count of a decode step is small, and one program needs no
grid-wide barrier): a histogram of the expert ids, the padded exclusive prefix sum, the block owners,
then each pair takes its row with an atomic increment of its expert's cursor. The order of rows inside
an expert's block is whatever the atomics give; it changes nothing, since every row is computed on its
own and written back to its own pair. Pairs with an id < 0 (another rank's experts) get no row.

Every shape depends only on n, E and BLOCK_M, so the whole grouping is captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class ExpertAlignment:
    sorted_ids: torch.Tensor  # [max_rows] int32 flat pair index per row; num_pairs = padding
    block_expert: torch.Tensor  # [max_blocks] int32 expert of each block; num_experts = skip
    num_pairs: int
    block_m: int
    pairs: bool = False  # one block per pair: sorted_ids holds each pair's expert (pairs_as_blocks)

    @property
    def num_blocks(self) -> int:
        return self.num_pairs if self.pairs else self.block_expert.numel()


def pairs_as_blocks(topk_ids: torch.Tensor, block_m: int) -> ExpertAlignment:
    """The small-batch layout: block p is routed pair p alone (its expert read from the ids), no launch.

    At a few tokens nearly every pair has its own expert, so grouping would save no weight reads."""
    flat = topk_ids.reshape(-1)
    return ExpertAlignment(flat, flat, flat.numel(), block_m, pairs=True)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks needed in the worst case: sum over experts of ceil(count / BLOCK_M)."""
    return triton.cdiv(num_pairs + min(num_pairs, num_experts) * (block_m - 1), block_m)


@triton.jit
def _align_kernel(
    Ids,
    Sorted,
    BlockExpert,
    Cursor,
    n,
    E,
    num_blocks,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    bins = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, n, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        e = tl.load(Ids + offs, mask=offs < n, other=-1)
        # out-of-range ids (past n, or another rank's) land in the spill bin BLOCK_E - 1 (>= E)
        e = tl.where((e >= 0) & (e < E), e, BLOCK_E - 1)
        counts += tl.histogram(e, BLOCK_E)
    counts = tl.where(bins < E, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(Cursor + bins, starts, mask=bins < E)
    for b0 in range(0, num_blocks, BLOCK_B):
        blocks = b0 + tl.arange(0, BLOCK_B)
        first_row = blocks * BLOCK_M
        # the expert of a block: how many experts end at or before its first row
        owner = tl.sum((ends[None, :] <= first_row[:, None]).to(tl.int32), 1)
        owner = tl.minimum(owner, E)
        tl.store(BlockExpert + blocks, owner, mask=blocks < num_blocks)
    rows = num_blocks * BLOCK_M
    for r0 in range(0, rows, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        tl.store(Sorted + r, tl.full([CHUNK], 0, tl.int32) + n, mask=r < rows)
    tl.debug_barrier()
    for start in range(0, n, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        e = tl.load(Ids + offs, mask=offs < n, other=-1)
        ok = (offs < n) & (e >= 0) & (e < E)
        pos = tl.atomic_add(Cursor + e, tl.full([CHUNK], 1, tl.int32), mask=ok)
        tl.store(Sorted + pos, offs, mask=ok)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertAlignment:
    """Rows grouped by expert for `topk_ids` [T, k] (ids < 0: no row); see the module docstring."""
    flat = topk_ids.reshape(-1)
    if flat.dtype != torch.int32:
        flat = flat.to(torch.int32)
    n = flat.numel()
    nb = max_blocks(n, num_experts, block_m)
    dev = flat.device
    sorted_ids = torch.empty(nb * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(nb, dtype=torch.int32, device=dev)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=dev)
    _align_kernel[(1,)](
        flat,
        sorted_ids,
        block_expert,
        cursor,
        n,
        num_experts,
        nb,
        BLOCK_M=block_m,
        BLOCK_E=triton.next_power_of_2(num_experts + 1),
        CHUNK=min(1024, max(16, triton.next_power_of_2(n))),
        BLOCK_B=32,
        num_warps=4,
    )
    return ExpertAlignment(sorted_ids, block_expert, n, block_m)
