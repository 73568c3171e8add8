"""Per-layer K/V storage of the paged KV cache.

Slots are token-granular: page `p` owns slots `[p * block_size, (p + 1) * block_size)`, so a page is a
contiguous run of slots and a paged kernel can view a buffer as `[num_pages, block_size, heads, dim]`.
Page 0 is reserved as a padding target (CUDA-graph padding and dummy writes land there), so the
allocator hands out pages 1..num_pages-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVPoolSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int

    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def pages_for_bytes(self, budget_bytes: int) -> int:
        return max(0, budget_bytes // (self.bytes_per_token() * self.block_size))


class KVPool:
    def __init__(self, spec: KVPoolSpec, num_pages: int, device: torch.device | str):
        if num_pages < 2:
            raise ValueError(
                f"the KV cache needs at least 2 pages of {spec.block_size} tokens, got {num_pages}; "
                "raise --max-total-tokens or the memory budget"
            )
        self.spec = spec
        self.num_pages = num_pages
        self.num_slots = num_pages * spec.block_size
        shape = (self.num_slots, spec.num_kv_heads, spec.head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=spec.dtype, device=device) for _ in range(spec.num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=spec.dtype, device=device) for _ in range(spec.num_layers)]

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of new tokens ([T, kv_heads, head_dim]) at slots `loc` ([T])."""
        self.k_buffers[layer_id][loc] = k.to(self.spec.dtype)
        self.v_buffers[layer_id][loc] = v.to(self.spec.dtype)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def paged_view(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_pages, block_size, kv_heads, head_dim] views for paged kernels."""
        s = self.spec
        shape = (self.num_pages, s.block_size, s.num_kv_heads, s.head_dim)
        return self.k_buffers[layer_id].view(shape), self.v_buffers[layer_id].view(shape)
