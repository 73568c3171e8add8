"""Exact verification of a chain of draft tokens (speculative rejection sampling).

For drafted tokens x_1..x_k proposed from distributions q_1..q_k, and the target's distributions p_1..p_k+1
at the same positions (each conditioned on the drafts before it), token j is accepted with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection a token is drawn from norm(max(0, p_j - q_j)) and the run
ends; when all k are accepted a bonus token is drawn from p_k+1. Every emitted token is then distributed
exactly as the target's own sample would be (Leviathan et al., Chen et al. 2023). A deterministic draft
(NGRAM, a greedy EAGLE3 chain) is the case q_j = one-hot(x_j): accept with probability p_j(x_j), and on
rejection draw from p_j with x_j removed.

`target_probs` turns logits into the distribution the step's sampler would draw from (logit bias, the
min_new_tokens ban, penalties, temperature, top-k, top-p, min-p), so verification and plain sampling agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.logit_adjust import apply_logit_bias
from tokenspeed.runtime.layers.sampling.penalties import apply_penalties, needs_penalties
from tokenspeed.runtime.layers.sampling.request import SamplingRequest
from tokenspeed.runtime.layers.sampling.sampler import mask_min_new_tokens
from tokenspeed.runtime.layers.sampling.torch_sampler import GREEDY_TEMPERATURE, filter_sorted_probs


def is_greedy(req: SamplingRequest, greedy_backend: bool) -> bool:
    return greedy_backend or req.sampling.temperature <= GREEDY_TEMPERATURE


def target_probs(
    logits: torch.Tensor, rows: Sequence[SamplingRequest], greedy_backend: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """([R, V] float32 probabilities each row is sampled from, [R, V] the logits its logprobs are read from).

    A greedy row's distribution is one-hot on its argmax. `greedy_backend` (--sampling-backend greedy) makes
    every row greedy and skips penalties, as that backend does."""
    logits = apply_logit_bias(logits, rows).float()
    adjusted = logits
    logits = mask_min_new_tokens(logits, rows)
    if not greedy_backend and needs_penalties(rows):
        logits = apply_penalties(logits, rows)
    greedy = [is_greedy(r, greedy_backend) for r in rows]
    probs = torch.zeros_like(logits)
    probs.scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    sampled = [i for i, g in enumerate(greedy) if not g]
    if sampled:
        dev = logits.device
        idx = torch.tensor(sampled, device=dev)
        temps = torch.tensor([rows[i].sampling.temperature for i in sampled], dtype=torch.float32, device=dev)
        sorted_logits, order = (logits[idx] / temps.unsqueeze(1)).sort(dim=-1, descending=True)
        kept = filter_sorted_probs(
            sorted_logits,
            torch.tensor([rows[i].sampling.top_k for i in sampled], dtype=torch.int64, device=dev),
            torch.tensor([rows[i].sampling.top_p for i in sampled], dtype=torch.float32, device=dev),
            torch.tensor([rows[i].sampling.min_p for i in sampled], dtype=torch.float32, device=dev),
        )
        kept = kept / kept.sum(dim=-1, keepdim=True)
        probs[idx] = torch.zeros_like(kept).scatter_(1, order, kept)
    return probs, adjusted


def rejection_sample(
    p: torch.Tensor,
    draft: Sequence[int],
    q: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """The tokens a verify step emits for one request: the accepted prefix of `draft`, then one more.

    p: [k+1, V] target probabilities; draft: k token ids; q: [k, V] draft probabilities, None for a
    deterministic draft (one-hot). Returns between 1 and k+1 token ids."""
    k = len(draft)
    dev = p.device
    if k:
        d = torch.tensor(list(draft), dtype=torch.int64, device=dev)
        ar = torch.arange(k, device=dev)
        p_d = p[ar, d]
        q_d = q[ar, d] if q is not None else torch.ones_like(p_d)
        u = torch.rand(k, generator=generator, device=dev)
        # u < p/q without dividing (q_d > 0: the draft proposed the token)
        rejected = (u * q_d >= p_d).nonzero()
        m = int(rejected[0, 0]) if rejected.numel() else k
    else:
        m = 0
    if m < k:
        q_m = q[m] if q is not None else torch.nn.functional.one_hot(d[m], p.shape[1]).to(p.dtype)
        residual = (p[m] - q_m).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:
            residual = p[m]  # p == q up to rounding: a rejection there has probability 0
        last = int(torch.multinomial(residual, 1, generator=generator))
    else:
        last = int(torch.multinomial(p[k], 1, generator=generator))
    return [*draft[:m], last]


def greedy_verify(argmax: Sequence[int], draft: Sequence[int]) -> list[int]:
    """The greedy case without drawing anything: drafts kept while they equal the target's argmax."""
    m = 0
    while m < len(draft) and draft[m] == argmax[m]:
        m += 1
    return [*draft[:m], int(argmax[m])]
