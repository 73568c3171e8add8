"""`--sampling-backend flashinfer` and `flashinfer_full`: FlashInfer's sorting-free sampling kernels.

`flashinfer`: fused softmax with per-row temperature, then top-k/top-p rejection sampling.
`flashinfer_full`: logit bias and penalties first, then softmax, top-k and top-p renormalisation and
min-p sampling (the kernel sequence FlashInfer offers for min-p).
Rows with greedy settings take the argmax. Rows with a per-request seed are drawn by our Triton
Gumbel-max kernel instead, whose noise is keyed by the request's seed, so they stay reproducible
whatever else shares the batch (FlashInfer takes one generator for the whole batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.gpu_params import SamplingTensors
from tokenspeed.runtime.layers.sampling.gpu_sampler import GpuSampler
from tokenspeed.runtime.layers.sampling.host_tensors import to_device
from tokenspeed.runtime.layers.sampling.request import SamplingRequest


class FlashInferSampler(GpuSampler):
    name = "flashinfer"
    applies_penalties = False

    def __init__(self, device: torch.device | str, enable_nan_detection: bool = False):
        super().__init__(device, enable_nan_detection)
        try:
            import flashinfer.sampling as fs
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ValueError(
                f"--sampling-backend {self.name} needs the flashinfer-python package; install it or use triton"
            ) from exc
        self.fs = fs

    def _draw(self, logits: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
        fs = self.fs
        vocab = logits.shape[1]
        # FlashInfer reads top_k <= 0 as "keep nothing"; the vocabulary size is its "keep all".
        top_k = torch.where(p.top_k > 0, p.top_k, vocab)
        temp = torch.clamp(p.temperature, min=1e-5)
        probs = fs.softmax(logits, temperature=temp)
        if not self.full:
            return fs.top_k_top_p_sampling_from_probs(probs, top_k, p.top_p).long()
        probs = fs.top_k_renorm_probs(probs, top_k)
        probs = fs.top_p_renorm_probs(probs, p.top_p)
        return fs.min_p_sampling_from_probs(probs, p.min_p).long()

    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        logits, params = self._prepare(logits, reqs)
        logits = logits.float()
        argmax = torch.argmax(logits, dim=-1)
        if params.all_greedy:
            return argmax
        seeded = [r.sampling.seed is not None for r in reqs]
        if all(seeded):
            drawn = self._seeded(logits, params)
        else:
            drawn = self._draw(logits, params)
            if any(seeded):
                rows = to_device([i for i, s in enumerate(seeded) if s], torch.int64, logits.device)
                sub = SamplingTensors(
                    params.temperature[rows], params.top_k[rows], params.top_p[rows], params.min_p[rows],
                    params.seeds[rows], False, True,
                )  # fmt: skip
                drawn[rows] = self._seeded(logits[rows], sub)
        greedy = (params.temperature <= 1e-5) | (params.top_k == 1)
        return torch.where(greedy, argmax, drawn)

    @staticmethod
    def _seeded(logits: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
        from tokenspeed.runtime.kernels.sampling import sample_from_logits

        return sample_from_logits(logits, p.temperature, p.top_k, p.top_p, p.min_p, p.seeds)


class FlashInferFullSampler(FlashInferSampler):
    name = "flashinfer_full"
    applies_penalties = True
    full = True
