"""What the GPU sampling backends (triton, flashinfer and their `_full` forms) share: they need CUDA, draw
per-row seeds from one host RNG, and either apply the `_full` logit adjustments or say once which request
parameters they ignore; then the parameters go to the device as tensors (gpu_params.py).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.gpu_params import (
    SamplingTensors,
    apply_full_adjustments,
    ignored_params,
)
from tokenspeed.runtime.layers.sampling.request import SamplingRequest
from tokenspeed.runtime.layers.sampling.sampler import Sampler

logger = logging.getLogger(__name__)


class GpuSampler(Sampler):
    full = False  # the `_full` form: min-p, logit bias and penalties too

    def __init__(self, device: torch.device | str, enable_nan_detection: bool = False):
        super().__init__(device, enable_nan_detection)
        if self.device.type != "cuda":
            raise ValueError(f"--sampling-backend {self.name} needs a CUDA GPU; use torch or greedy on CPU")
        self.rng = random.Random()
        self._warned = False

    def _prepare(
        self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]
    ) -> tuple[torch.Tensor, SamplingTensors]:
        """The logits to sample from (adjusted by the `_full` form) and the rows' parameters on the device."""
        if self.full:
            logits = apply_full_adjustments(logits, reqs, with_bias=False)
        elif not self._warned and (skipped := ignored_params(reqs)):
            self._warned = True
            logger.warning(
                "--sampling-backend %s ignores %s; use %s_full to apply them",
                self.name,
                ", ".join(skipped),
                self.name,
            )
        return logits, SamplingTensors.build(reqs, logits.device, self.rng, with_min_p=self.full)
