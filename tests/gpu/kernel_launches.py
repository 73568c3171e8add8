"""The CUDA kernels a call launches, read from PyTorch's profiler: how the GPU tests check that a decode
step runs a given kernel for every layer it should."""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_kernel_names(fn: Callable[[], object]) -> list[str]:
    """The names of the CUDA kernels `fn()` launches, in order (the device synchronized before reading)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
