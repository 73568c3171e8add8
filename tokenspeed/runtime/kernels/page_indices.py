"""Build FlashInfer's compact page list from the request -> token table, on the device.

FlashInfer reads a paged cache through (indptr, indices): request `b`'s pages are
`indices[indptr[b]:indptr[b + 1]]`. Our table maps tokens to slots and a page's slots are contiguous
(`KVPool`), so page `i` of a request is `req_to_token[row, i * block_size] // block_size`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _page_indices_kernel(
    req_to_token,
    req_pool_indices,
    seq_lens,
    indptr,
    out,
    stride_r2t,
    BLOCK_SIZE: tl.constexpr,
    CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    seq = tl.load(seq_lens + b)
    n_pages = tl.cdiv(seq, BLOCK_SIZE)
    dst = tl.load(indptr + b)
    for p0 in range(0, n_pages, CHUNK):
        offs = p0 + tl.arange(0, CHUNK)
        mask = offs < n_pages
        slot = tl.load(req_to_token + row * stride_r2t + offs * BLOCK_SIZE, mask=mask, other=0)
        tl.store(out + dst + offs, (slot // BLOCK_SIZE).to(tl.int32), mask=mask)


def build_page_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    indptr: torch.Tensor,
    out: torch.Tensor,
    block_size: int,
) -> None:
    """indptr: [B + 1] int32 on the device; out: int32, at least indptr[-1] long."""
    bs = seq_lens.shape[0]
    if bs == 0:
        return
    _page_indices_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        seq_lens,
        indptr,
        out,
        req_to_token.stride(0),
        BLOCK_SIZE=block_size,
        CHUNK=256,
        num_warps=4,
    )
