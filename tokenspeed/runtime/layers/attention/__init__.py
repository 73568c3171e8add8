"""Attention: the layer models call (`PagedAttention`) and the backends behind it, built by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenspeed.runtime.layers.attention.backend import AttentionBackend, AttentionBackendRegistry
from tokenspeed.runtime.layers.attention.paged_attention import PagedAttention

if TYPE_CHECKING:
    import torch

    from tokenspeed.runtime.cache.kv_pool import KVPool


def _torch_backend(**kwargs: Any) -> AttentionBackend:
    from tokenspeed.runtime.layers.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend(**kwargs)


def _triton_backend(**kwargs: Any) -> AttentionBackend:
    from tokenspeed.runtime.layers.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(**kwargs)


def _flashinfer_backend(**kwargs: Any) -> AttentionBackend:
    from tokenspeed.runtime.layers.attention.flashinfer_backend import FlashInferAttentionBackend

    return FlashInferAttentionBackend(**kwargs)


def attention_backend_registry() -> AttentionBackendRegistry:
    """A fresh registry of every backend this build knows; factories import their module lazily."""
    registry = AttentionBackendRegistry()
    registry.register("torch", _torch_backend)
    registry.register("triton", _triton_backend)
    registry.register("flashinfer", _flashinfer_backend)
    return registry


def create_attention_backend(
    name: str,
    model_config: Any,
    kv_pool: KVPool,
    device: torch.device | str,
    registry: AttentionBackendRegistry | None = None,
    **options: Any,
) -> AttentionBackend:
    """The `--attention-backend NAME` backend; an unknown name raises ValueError listing the choices.

    `options` (e.g. `reduce_in_fp32`) go to the backend's constructor; backends ignore what they do not use.
    """
    registry = registry or attention_backend_registry()
    return registry.create(name, model_config=model_config, kv_pool=kv_pool, device=device, **options)


__all__ = ["PagedAttention", "attention_backend_registry", "create_attention_backend"]
