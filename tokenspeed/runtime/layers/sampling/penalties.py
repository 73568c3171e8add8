"""Repetition, frequency and presence penalties over a request's tokens.

Repetition (as in Hugging Face and vLLM) covers prompt and output: a seen token's logit is divided by
the penalty when positive and multiplied when negative. Frequency and presence (OpenAI) cover the output
only: logit -= frequency * count + presence * (count > 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.host_tensors import padded_ids
from tokenspeed.runtime.layers.sampling.request import SamplingRequest


def needs_penalties(reqs: Sequence[SamplingRequest]) -> bool:
    return any(
        r.sampling.repetition_penalty != 1.0 or r.sampling.frequency_penalty or r.sampling.presence_penalty
        for r in reqs
    )


def apply_penalties(logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
    """Returns penalized float32 logits ([S, V]); the input is left untouched."""
    S, V = logits.shape
    dev = logits.device
    logits = logits.float().clone()
    freq = torch.tensor([r.sampling.frequency_penalty for r in reqs], dtype=torch.float32, device=dev)
    pres = torch.tensor([r.sampling.presence_penalty for r in reqs], dtype=torch.float32, device=dev)
    rep = torch.tensor([r.sampling.repetition_penalty for r in reqs], dtype=torch.float32, device=dev)
    # Column V is a sink for padding, dropped afterwards.
    if bool((freq != 0).any() or (pres != 0).any()):
        out_ids = padded_ids([r.token_ids[r.num_prompt_tokens :] for r in reqs], V, dev)
        counts = torch.zeros((S, V + 1), dtype=torch.float32, device=dev)
        counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=torch.float32))
        counts = counts[:, :V]
        logits -= freq.unsqueeze(1) * counts + pres.unsqueeze(1) * (counts > 0).float()
    if bool((rep != 1.0).any()):
        all_ids = padded_ids([r.token_ids for r in reqs], V, dev)
        seen = torch.zeros((S, V + 1), dtype=torch.bool, device=dev)
        seen.scatter_(1, all_ids, True)
        seen = seen[:, :V]
        r = rep.unsqueeze(1)
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    return logits
