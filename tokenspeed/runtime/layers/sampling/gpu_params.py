"""Per-row sampling parameters as device tensors, and the logit adjustments of the `*_full` backends.

Everything here is decided from host-side request data (python floats and lists), then copied to the
device without waiting for it: the GPU sampling backends never read a device value back while sampling,
so the only sync of a step is the runner reading the sampled ids.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenspeed.runtime.layers.sampling.host_tensors import padded_ids, to_device
from tokenspeed.runtime.layers.sampling.request import SamplingRequest

_MASK31 = 0x7FFFFFFF


def row_seed(seed: int, step: int) -> int:
    """A distinct Philox key per (request seed, output position): same seed, same tokens, any batch."""
    return ((seed * 0x9E3779B1) ^ (step * 0x85EBCA77 + 0x165667B1)) & _MASK31


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # [S] float32
    top_k: torch.Tensor  # [S] int32, <= 0 disables
    top_p: torch.Tensor  # [S] float32
    min_p: torch.Tensor  # [S] float32
    seeds: torch.Tensor  # [S] int64
    all_greedy: bool
    needs_filter: bool  # some row has top-k, top-p or min-p

    @classmethod
    def build(
        cls, reqs: Sequence[SamplingRequest], device: torch.device, rng: random.Random, with_min_p: bool
    ) -> SamplingTensors:
        temps, ks, ps, mps, seeds = [], [], [], [], []
        for r in reqs:
            sp = r.sampling
            temps.append(float(sp.temperature))
            ks.append(int(sp.top_k) if sp.top_k is not None else -1)
            ps.append(float(sp.top_p))
            mps.append(float(sp.min_p) if with_min_p else 0.0)
            base = sp.seed if sp.seed is not None else rng.getrandbits(31)
            seeds.append(row_seed(int(base), int(r.num_output_tokens)))
        greedy = all(t <= 1e-5 or k == 1 for t, k in zip(temps, ks, strict=True))
        needs_filter = any(k > 0 for k in ks) or any(p < 1.0 for p in ps) or any(m > 0 for m in mps)
        return cls(
            temperature=to_device(temps, torch.float32, device),
            top_k=to_device(ks, torch.int32, device),
            top_p=to_device(ps, torch.float32, device),
            min_p=to_device(mps, torch.float32, device),
            seeds=to_device(seeds, torch.int64, device),
            all_greedy=greedy,
            needs_filter=needs_filter,
        )


def ignored_params(reqs: Sequence[SamplingRequest]) -> list[str]:
    """Names of parameters a basic (non-`_full`) backend does not apply, for a one-time warning."""
    names = set()
    for r in reqs:
        sp = r.sampling
        if sp.min_p > 0:
            names.add("min_p")
        if sp.repetition_penalty != 1.0 or sp.frequency_penalty or sp.presence_penalty:
            names.add("penalties")
    return sorted(names)


def apply_full_adjustments(
    logits: torch.Tensor, reqs: Sequence[SamplingRequest], with_bias: bool = True
) -> torch.Tensor:
    """Logit bias, then repetition / frequency / presence penalties (same rules as the torch reference),
    on float32 logits. Which adjustments run is decided on the host, so no device value is read."""
    S, V = logits.shape
    dev = logits.device
    out = logits.float()
    cloned = out is not logits

    def writable() -> torch.Tensor:
        nonlocal out, cloned
        if not cloned:
            out = out.clone()
            cloned = True
        return out

    bias_rows, bias_cols, bias_vals = [], [], []
    # Sampler.sample adds the bias itself (every backend honours it); with_bias=False avoids adding it twice.
    for i, r in enumerate(reqs if with_bias else ()):
        for tok, val in (getattr(r.sampling, "logit_bias", None) or {}).items():
            tok = int(tok)
            if 0 <= tok < V:
                bias_rows.append(i)
                bias_cols.append(tok)
                bias_vals.append(float(val))
    if bias_rows:
        writable().index_put_(
            (to_device(bias_rows, torch.int64, dev), to_device(bias_cols, torch.int64, dev)),
            to_device(bias_vals, torch.float32, dev),
            accumulate=True,
        )
    freq = [float(r.sampling.frequency_penalty) for r in reqs]
    pres = [float(r.sampling.presence_penalty) for r in reqs]
    rep = [float(r.sampling.repetition_penalty) for r in reqs]
    if any(freq) or any(pres):
        ids = padded_ids([list(r.token_ids[r.num_prompt_tokens :]) for r in reqs], V, dev)
        counts = torch.zeros((S, V + 1), dtype=torch.float32, device=dev)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
        counts = counts[:, :V]
        f = to_device(freq, torch.float32, dev).unsqueeze(1)
        p = to_device(pres, torch.float32, dev).unsqueeze(1)
        writable().sub_(f * counts + p * (counts > 0).float())
    if any(x != 1.0 for x in rep):
        ids = padded_ids([list(r.token_ids) for r in reqs], V, dev)
        seen = torch.zeros((S, V + 1), dtype=torch.bool, device=dev)
        seen.scatter_(1, ids, True)
        seen = seen[:, :V]
        rp = to_device(rep, torch.float32, dev).unsqueeze(1)
        cur = writable()
        out = torch.where(seen, torch.where(cur > 0, cur / rp, cur * rp), cur)
    return out
