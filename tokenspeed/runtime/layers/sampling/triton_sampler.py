"""`--sampling-backend triton` and `triton_full`: one Triton launch draws every row (Gumbel-max).

`triton` applies temperature, top-k and top-p; `triton_full` adds min-p, logit bias and the repetition,
frequency and presence penalties. Parameters go to the device as tensors built from host data, so
sampling never waits on the GPU; the kernel lives in `kernels/sampling.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.gpu_sampler import GpuSampler
from tokenspeed.runtime.layers.sampling.request import SamplingRequest


class TritonSampler(GpuSampler):
    name = "triton"
    applies_penalties = False

    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        from tokenspeed.runtime.kernels.sampling import sample_from_logits

        logits, params = self._prepare(logits, reqs)
        if params.all_greedy:
            return torch.argmax(logits, dim=-1)
        return sample_from_logits(
            logits, params.temperature, params.top_k, params.top_p, params.min_p, params.seeds
        )


class TritonFullSampler(TritonSampler):
    name = "triton_full"
    applies_penalties = True
    full = True
