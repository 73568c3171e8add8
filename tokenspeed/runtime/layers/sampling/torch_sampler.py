"""Reference sampling in plain torch: penalties, temperature, top-k, top-p, min-p, per-request seeds.

Filters work in sorted order (one sort per step); top-p and min-p see the distribution renormalized
after top-k, as in Hugging Face. Drawing uses the exponential race (argmax of p / Exp(1) noise), which
samples exactly from p; a request with a seed draws its noise from its own generator, so its tokens do
not depend on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.penalties import apply_penalties, needs_penalties
from tokenspeed.runtime.layers.sampling.request import SamplingRequest
from tokenspeed.runtime.layers.sampling.sampler import Sampler

GREEDY_TEMPERATURE = 1e-5


def filter_sorted_probs(
    sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Sorted (descending) logits -> probabilities with filtered-out entries zeroed (not renormalized)."""
    V = sorted_logits.shape[-1]
    ranks = torch.arange(V, device=sorted_logits.device).unsqueeze(0)
    if bool((top_k > 0).any()):
        k = torch.where(top_k > 0, top_k, V).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    if bool((top_p < 1.0).any()):
        # Keep the smallest head whose mass reaches top_p: a token stays if the mass before it is < p.
        before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(before > top_p.unsqueeze(1), 0.0)
    if bool((min_p > 0).any()):
        probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs[:, :1], 0.0)
    return probs


class TorchSampler(Sampler):
    name = "torch"

    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        dev = logits.device
        logits = apply_penalties(logits, reqs) if needs_penalties(reqs) else logits.float()
        argmax = torch.argmax(logits, dim=-1)
        host_temps = [r.sampling.temperature for r in reqs]
        if all(t <= GREEDY_TEMPERATURE for t in host_temps):
            return argmax  # decided on the host: an all-greedy step never waits for the device here
        temps = torch.tensor(host_temps, dtype=torch.float32, device=dev)
        greedy = temps <= GREEDY_TEMPERATURE
        scaled = logits / torch.where(greedy, 1.0, temps).unsqueeze(1)
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = filter_sorted_probs(
            sorted_logits,
            torch.tensor([r.sampling.top_k for r in reqs], dtype=torch.int64, device=dev),
            torch.tensor([r.sampling.top_p for r in reqs], dtype=torch.float32, device=dev),
            torch.tensor([r.sampling.min_p for r in reqs], dtype=torch.float32, device=dev),
        )
        noise = torch.empty_like(probs).exponential_()
        for i, r in enumerate(reqs):
            if r.generator is not None:
                noise[i] = torch.empty(probs.shape[1], device=dev).exponential_(generator=r.generator)
        picked = torch.argmax(probs / noise, dim=-1, keepdim=True)
        sampled = order.gather(1, picked).squeeze(1)
        return torch.where(greedy, argmax, sampled)
