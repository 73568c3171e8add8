"""The attention backend interface, its registry, and the backend chosen when the flag is left unset.

A backend is chosen once, at model-runner construction, by `--attention-backend`. Each step the runner
calls `init_forward_metadata(fb)` once; every attention layer then calls `forward`, which stores the new
tokens' K/V into the pool at `fb.out_cache_loc` and attends over the request's cached and new tokens.
CUDA-graph capable backends also implement the capture/replay hooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        layer_id: int,
        fb: ForwardBatch,
        scaling: float,
        kv_stored: bool = False,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Stores the new tokens' K/V (unless the fused RoPE + KV-store kernel already did), then attends."""
        if not kv_stored:
            self.store_new_kv(k, v, layer_id, fb)
        return self.attend(q, k, v, layer_id, fb, scaling)

    def store_new_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> None:
        # The pool's own store runs on every device and quantizes into an FP8 cache; the CUDA backends
        # replace it with a one-launch kernel.
        fb.kv_pool.set_kv(layer_id, fb.out_cache_loc, k, v)

    @abstractmethod
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch, scale: float
    ) -> torch.Tensor:
        """Attention of q over the requests' cached K/V, the new tokens' included (k/v are those new
        tokens, for a backend that reads them from the activations rather than back from the pool)."""

    # CUDA-graph hooks; backends that cannot be captured keep the defaults.
    supports_cuda_graph: bool = False
    # True when the layer may store the new K/V itself with the fused RoPE + KV-store kernel
    # (`layers/attention/paged_attention.py`) and call `forward(..., kv_stored=True)`, so only attention runs.
    supports_fused_rope_store: bool = False

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")

    def init_forward_metadata_capture(self, fb: ForwardBatch) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")

    def init_forward_metadata_replay(self, fb: ForwardBatch) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")


class AttentionBackendRegistry:
    """Name -> lazy factory, so importing the registry never imports Triton or FlashInfer."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[..., AttentionBackend]] = {}

    def register(self, name: str, factory: Callable[..., AttentionBackend]) -> None:
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, **kwargs) -> AttentionBackend:
        if name not in self._factories:
            raise ValueError(
                f"--attention-backend {name!r} is not available in this build; choose one of {self.names()}"
            )
        return self._factories[name](**kwargs)


def default_attention_backend(device: torch.device | str, kv_dtype: torch.dtype) -> str:
    """The attention backend used when `--attention-backend` is left unset.

    The seed defers this choice to where both the hardware and the model are known: the torch reference on
    the CPU; on an NVIDIA GPU our Triton kernels, which cover every dtype. On the H200 (Llama-3.1-8B shape,
    benchmarks/results/gpu_decode.json) Triton decodes faster than FlashInfer up to 16 concurrent requests and
    in every synchronous step (FlashInfer plans on the host each step), FlashInfer faster from 32 on with
    overlap scheduling; neither reaches 90% of the bandwidth limit. So Triton stays the default, and FlashInfer
    is chosen with `--attention-backend flashinfer` (bfloat16/float16 caches) for high-concurrency serving.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "torch"
    return "triton"
