"""Per-layer K/V storage of the paged KV cache.

Slots are token-granular: page `p` owns slots `[p * block_size, (p + 1) * block_size)`, so a page is a
contiguous run of slots and a paged kernel can view a buffer as `[num_pages, block_size, heads, dim]`.
Page 0 is reserved as a padding target (CUDA-graph padding and dummy writes land there), so the
allocator hands out pages 1..num_pages-1.

With `--kv-cache-dtype fp8_e4m3` the buffers hold float8_e4m3fn (one byte an element, so twice the tokens
of a bf16 pool in the same memory) and each layer has a K and a V scale: a write stores `x / scale`
clamped to the finite range, a read gives `stored * scale` (`dequant`). The scales are per tensor, from
the checkpoint's `k_scale` / `v_scale` or `--quantization-param-path`, else 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# `--kv-cache-dtype` (after the seed's alias fp8 -> fp8_e4m3) -> storage dtype; "auto" is the model's.
KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn}


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype!r} is not supported; choose auto, fp8 or fp8_e4m3"
        )
    return KV_CACHE_DTYPES[kv_cache_dtype]


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
    def __init__(
        self,
        spec: KVPoolSpec,
        num_pages: int,
        device: torch.device | str,
        scales: tuple[list[float], list[float]] | None = None,
    ):
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
        self.quantized = spec.dtype in KV_CACHE_DTYPES.values()
        ones = [1.0] * spec.num_layers
        self.k_scales, self.v_scales = (list(scales[0]), list(scales[1])) if scales else (ones, list(ones))
        if len(self.k_scales) != spec.num_layers or len(self.v_scales) != spec.num_layers:
            raise ValueError(f"KV scales for {len(self.k_scales)} layers, the model has {spec.num_layers}")
        self._max = float(torch.finfo(spec.dtype).max) if self.quantized else 0.0

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of new tokens ([T, kv_heads, head_dim]) at slots `loc` ([T])."""
        self.k_buffers[layer_id][loc] = self.quantize(k, self.k_scales[layer_id])
        self.v_buffers[layer_id][loc] = self.quantize(v, self.v_scales[layer_id])

    def quantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """What the pool stores for `x`: FP8 of x / scale, clamped (a bare cast would overflow to NaN)."""
        if not self.quantized:
            return x.to(self.spec.dtype)
        return (x.float() / scale).clamp(-self._max, self._max).to(self.spec.dtype)

    def dequant(self, stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        """Values read from a buffer (any gather of it) as `dtype`."""
        if not self.quantized:
            return stored.to(dtype)
        return (stored.float() * scale).to(dtype)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def paged_view(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_pages, block_size, kv_heads, head_dim] views for paged kernels."""
        s = self.spec
        shape = (self.num_pages, s.block_size, s.num_kv_heads, s.head_dim)
        return self.k_buffers[layer_id].view(shape), self.v_buffers[layer_id].view(shape)
