"""Random paged-attention batches and a float64 reference, shared by the GPU backend tests.

A case is a list of (prefix_len, extend_len) requests: a decode is (n, 1), a fresh prefill (0, n), a
chunk over a cached prefix (p, n). Pages are handed out in a shuffled order, so a request's tokens are
scattered through the pool the way they are after the allocator has been busy for a while.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tokenspeed.runtime.cache.kv_pool import KVPool, KVPoolSpec
from tokenspeed.runtime.execution.forward_batch import ForwardBatch


@dataclass
class AttnCase:
    fb: ForwardBatch
    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [T, KVH, D]
    v: torch.Tensor
    pool: KVPool
    spec: tuple[int, int, int]  # heads, kv heads, head_dim


def make_case(
    reqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int = 16,
    device: str = "cuda",
    seed: int = 0,
    layers: int = 1,
    num_pages: int | None = None,
) -> AttnCase:
    gen = torch.Generator().manual_seed(seed)
    pages_needed = [math.ceil((p + e) / block_size) for p, e in reqs]
    num_pages = num_pages or sum(pages_needed) + 3
    spec = KVPoolSpec(layers, num_kv_heads, head_dim, dtype, block_size)
    pool = KVPool(spec, num_pages, device)
    for layer in range(layers):
        for buf in (*pool.get_kv(layer),):
            buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()  # page 0 stays the padding page
    max_len = max(p + e for p, e in reqs)
    rows = len(reqs) + 2
    req_to_token = torch.zeros((rows, max_len + block_size), dtype=torch.int32)
    pool_rows = torch.randperm(rows, generator=gen)[: len(reqs)]
    out_loc, positions = [], []
    for i, (prefix, ext) in enumerate(reqs):
        pages = [order.pop() for _ in range(pages_needed[i])]
        slots = torch.tensor(
            [pages[t // block_size] * block_size + t % block_size for t in range(prefix + ext)]
        )
        req_to_token[pool_rows[i], : prefix + ext] = slots.to(torch.int32)
        out_loc.append(slots[prefix:])
        positions.append(torch.arange(prefix, prefix + ext))
    total = sum(e for _, e in reqs)
    q = torch.randn((total, num_heads, head_dim), generator=gen).to(dtype)
    k = torch.randn((total, num_kv_heads, head_dim), generator=gen).to(dtype)
    v = torch.randn((total, num_kv_heads, head_dim), generator=gen).to(dtype)
    ext_lens = [e for _, e in reqs]
    seq_lens = [p + e for p, e in reqs]
    logits_idx = torch.cumsum(torch.tensor(ext_lens), 0) - 1
    fb = ForwardBatch(
        input_ids=torch.zeros(total, dtype=torch.int64, device=device),
        positions=torch.cat(positions).to(device),
        out_cache_loc=torch.cat(out_loc).to(device=device, dtype=torch.int64),
        req_pool_indices=pool_rows.to(device=device, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        extend_lens=torch.tensor(ext_lens, dtype=torch.int32, device=device),
        extend_prefix_lens=torch.tensor([p for p, _ in reqs], dtype=torch.int32, device=device),
        logits_indices=logits_idx.to(device),
        req_to_token=req_to_token.to(device),
        kv_pool=pool,
        attn_backend=None,
        seq_lens_cpu=seq_lens,
        extend_lens_cpu=ext_lens,
        is_decode_only=all(e == 1 for e in ext_lens),
    )
    return AttnCase(fb, q.to(device), k.to(device), v.to(device), pool, (num_heads, num_kv_heads, head_dim))


def reference(case: AttnCase, layer_id: int, scaling: float) -> torch.Tensor:
    """Float64 attention of every new token over its visible keys, read from the pool after the store
    (so the caller must have run the backend's forward, which stores K/V, first)."""
    fb = case.fb
    k_buf, v_buf = (b.double() for b in case.pool.get_kv(layer_id))
    heads, kv_heads, _ = case.spec
    group = heads // kv_heads
    out = torch.empty(case.q.shape, dtype=torch.float64, device=case.q.device)
    start = 0
    for b, (seq, ext) in enumerate(zip(fb.seq_lens_cpu, fb.extend_lens_cpu, strict=True)):
        row = int(fb.req_pool_indices[b])
        slots = fb.req_to_token[row, :seq].long()
        kk = k_buf[slots].repeat_interleave(group, dim=1)  # [S, H, D]
        vv = v_buf[slots].repeat_interleave(group, dim=1)
        qq = case.q[start : start + ext].double()  # [E, H, D]
        scores = torch.einsum("ehd,shd->hes", qq, kk) * scaling
        prefix = seq - ext
        mask = (
            torch.arange(seq, device=qq.device)[None, :]
            <= (prefix + torch.arange(ext, device=qq.device))[:, None]
        )
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out[start : start + ext] = torch.einsum("hes,shd->ehd", scores.softmax(-1), vv)
        start += ext
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())
