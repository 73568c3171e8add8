"""The attention backend used when `--attention-backend` is left unset.

The seed defers this choice to where both the hardware and the model are known: the torch reference on
the CPU; on an NVIDIA GPU our Triton kernels, which cover every dtype and are the backend whose decode
and correctness figures on the H200 are in the README. FlashInfer is chosen with
`--attention-backend flashinfer` (bfloat16/float16 caches).
"""

from __future__ import annotations

import torch


def default_attention_backend(device: torch.device | str, kv_dtype: torch.dtype) -> str:
    device = torch.device(device)
    if device.type != "cuda":
        return "torch"
    return "triton"
