"""`--sampling-backend triton` and `triton_full`: one Triton launch draws every row (Gumbel-max).

`triton` applies temperature, top-k and top-p; `triton_full` adds min-p, logit bias and the repetition,
frequency and presence penalties. Parameters go to the device as tensors built from host data, so
sampling never waits on the GPU; the kernel lives in `kernels/sampling.py`.
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


class TritonSampler(Sampler):
    name = "triton"
    applies_penalties = False
    full = False

    def __init__(self, device: torch.device | str, enable_nan_detection: bool = False):
        super().__init__(device, enable_nan_detection)
        if self.device.type != "cuda":
            raise ValueError(f"--sampling-backend {self.name} needs a CUDA GPU; use torch or greedy on CPU")
        self.rng = random.Random()
        self._warned = False

    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        from tokenspeed.runtime.kernels.sampling import sample_from_logits

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
        params = SamplingTensors.build(reqs, logits.device, self.rng, with_min_p=self.full)
        if params.all_greedy:
            return torch.argmax(logits, dim=-1)
        return sample_from_logits(
            logits, params.temperature, params.top_k, params.top_p, params.min_p, params.seeds
        )


class TritonFullSampler(TritonSampler):
    name = "triton_full"
    applies_penalties = True
    full = True
