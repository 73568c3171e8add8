"""The attention backend used when `--attention-backend` is left unset.

The seed defers this choice to where both the hardware and the model are known: the torch reference on
the CPU; on an NVIDIA GPU our Triton kernels, which cover every dtype. On the H200 (Llama-3.1-8B shape,
benchmarks/results/gpu_decode.json) Triton decodes faster than FlashInfer up to 16 concurrent requests and
in every synchronous step (FlashInfer plans on the host each step), FlashInfer faster from 32 on with
overlap scheduling; neither reaches 90% of the bandwidth limit. So Triton stays the default, and FlashInfer
is chosen with `--attention-backend flashinfer` (bfloat16/float16 caches) for high-concurrency serving.
"""

from __future__ import annotations

import torch


def default_attention_backend(device: torch.device | str, kv_dtype: torch.dtype) -> str:
    device = torch.device(device)
    if device.type != "cuda":
        return "torch"
    return "triton"
