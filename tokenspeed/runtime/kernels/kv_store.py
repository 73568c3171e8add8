"""Store new tokens' K and V into the paged pool in one launch.

`KVPool.set_kv` does two indexed copies (two launches, plus a dtype cast when the layer's K/V differ
from the cache's dtype); on the decode path every launch counts, so the fast backends write both with
one kernel that also casts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from tokenspeed.runtime.cache.kv_pool import KVPool


@triton.jit
def _store_kv_kernel(
    K,
    V,
    K_buf,
    V_buf,
    loc_ptr,
    stride_kt,
    stride_vt,
    stride_kbt,
    stride_vbt,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    loc = tl.load(loc_ptr + t).to(tl.int64)
    for c in range(0, ROW, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(K + t * stride_kt + offs, mask=mask)
        v = tl.load(V + t * stride_vt + offs, mask=mask)
        tl.store(K_buf + loc * stride_kbt + offs, k.to(K_buf.dtype.element_ty), mask=mask)
        tl.store(V_buf + loc * stride_vbt + offs, v.to(V_buf.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor
) -> None:
    """k/v: [T, kv_heads, head_dim] (heads and dim contiguous); k_buf/v_buf: [slots, kv_heads, head_dim]."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or k.stride(1) != k.shape[2]:
        k = k.contiguous()
    if v.stride(-1) != 1 or v.stride(1) != v.shape[2]:
        v = v.contiguous()
    row = k.shape[1] * k.shape[2]
    block = min(1024, triton.next_power_of_2(row))
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_buf,
        v_buf,
        loc,
        k.stride(0),
        v.stride(0),
        k_buf.stride(0),
        v_buf.stride(0),
        ROW=row,
        BLOCK=block,
        num_warps=4,
    )


def store_kv_into_pool(
    pool: KVPool, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """The new tokens' K/V into layer `layer_id` of `pool` at slots `loc`: one launch for a bf16/fp16 cache;
    an FP8 cache keeps the pool's own quantizing store."""
    if pool.quantized:
        pool.set_kv(layer_id, loc, k, v)
        return
    k_buf, v_buf = pool.get_kv(layer_id)
    store_kv(k, v, k_buf, v_buf, loc)
