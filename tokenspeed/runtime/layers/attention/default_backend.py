"""The attention backend used when `--attention-backend` is left unset.

The seed defers this choice to where both the hardware and the model are known: the torch reference on
the CPU; on an NVIDIA GPU, FlashInfer for bfloat16/float16 caches when it is installed (the faster of the
two on Hopper in our decode and prefill benchmarks), else our Triton kernels, which also cover float32.
"""

from __future__ import annotations

import importlib.util

import torch


def default_attention_backend(device: torch.device | str, kv_dtype: torch.dtype) -> str:
    device = torch.device(device)
    if device.type != "cuda":
        return "torch"
    if kv_dtype in (torch.float16, torch.bfloat16) and importlib.util.find_spec("flashinfer") is not None:
        return "flashinfer"
    return "triton"
