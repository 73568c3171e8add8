"""Sampling backends, chosen once by `--sampling-backend`.

The registry maps a name to `module:Class`, imported only when chosen, so GPU backends can register
here without importing their kernels on CPU machines.
"""

from __future__ import annotations

import importlib

import torch

from tokenspeed.runtime.layers.sampling.sampler import DeviceSample, SampleOutput, Sampler

SAMPLING_BACKENDS: dict[str, str] = {
    "greedy": "tokenspeed.runtime.layers.sampling.sampler:GreedySampler",
    "torch": "tokenspeed.runtime.layers.sampling.torch_sampler:TorchSampler",
    "flashinfer": "tokenspeed.runtime.layers.sampling.flashinfer_sampler:FlashInferSampler",
    "flashinfer_full": "tokenspeed.runtime.layers.sampling.flashinfer_sampler:FlashInferFullSampler",
    "triton": "tokenspeed.runtime.layers.sampling.triton_sampler:TritonSampler",
    "triton_full": "tokenspeed.runtime.layers.sampling.triton_sampler:TritonFullSampler",
}


def create_sampler(name: str, device: torch.device | str, enable_nan_detection: bool = False) -> Sampler:
    if name not in SAMPLING_BACKENDS:
        raise ValueError(
            f"--sampling-backend {name!r} is not available in this build; choose one of {sorted(SAMPLING_BACKENDS)}"
        )
    module, cls = SAMPLING_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(device, enable_nan_detection=enable_nan_detection)


__all__ = ["SAMPLING_BACKENDS", "DeviceSample", "SampleOutput", "Sampler", "create_sampler"]
