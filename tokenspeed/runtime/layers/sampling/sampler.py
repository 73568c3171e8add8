"""The sampler interface: logits of the rows that sample this step -> one token id per row.

Backends implement `_sample`; the shared parts (min_new_tokens masking, logprobs of the chosen token,
`--enable-nan-detection`) live here so every backend behaves the same at the edges.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenspeed.runtime.layers.sampling.logit_adjust import (
    apply_logit_bias,
    apply_token_bitmask,
    logprobs_wanted,
    read_logprobs,
)
from tokenspeed.runtime.layers.sampling.penalties import apply_penalties, needs_penalties
from tokenspeed.runtime.layers.sampling.request import SamplingRequest
from tokenspeed.sampling_params import SamplingParams


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float] | None = None  # log-probability of each chosen token under the model
    nan_rows: list[bool] | None = None  # rows whose logits held NaN (only with NaN detection)
    top_ids: list[list[int]] | None = None  # per row, the most likely tokens (top_logprobs)
    top_logprobs: list[list[float]] | None = None


@dataclass
class DeviceSample:
    """The same, still on the device: the runner copies it to the host without waiting (overlap)."""

    token_ids: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None = None  # [S] float32
    nan_rows: torch.Tensor | None = None  # [S] bool
    top_ids: torch.Tensor | None = None  # [S, K] int64, K the most alternatives a row asked for
    top_logprobs: torch.Tensor | None = None  # [S, K] float32


class Sampler(ABC):
    name: str = ""
    # whether `_sample` applies repetition / frequency / presence penalties (then logprobs include them)
    applies_penalties: bool = True

    def __init__(self, device: torch.device | str, enable_nan_detection: bool = False):
        self.device = torch.device(device)
        self.enable_nan_detection = enable_nan_detection

    def __call__(
        self, logits: torch.Tensor, reqs: Sequence[SamplingRequest], token_bitmask: torch.Tensor | None = None
    ) -> SampleOutput:
        out = self.sample(logits, reqs, token_bitmask)

        def host(t: torch.Tensor | None) -> list | None:
            return None if t is None else t.tolist()

        return SampleOutput(
            token_ids=out.token_ids.tolist(),
            logprobs=host(out.logprobs),
            nan_rows=host(out.nan_rows),
            top_ids=host(out.top_ids),
            top_logprobs=host(out.top_logprobs),
        )

    def sample(
        self, logits: torch.Tensor, reqs: Sequence[SamplingRequest], token_bitmask: torch.Tensor | None = None
    ) -> DeviceSample:
        """Like calling the sampler, but the results stay on the device (no host sync of its own).

        `token_bitmask` ([S, ceil(V / 32)] int32 on the device): the tokens each row's grammar allows."""
        nan_rows = None
        if self.enable_nan_detection:
            nan_rows = torch.isnan(logits).any(dim=-1)
            # Sample something harmless for those rows; the scheduler aborts them.
            logits = logits.masked_fill(nan_rows.unsqueeze(1), 0.0)
        logits = apply_logit_bias(logits, reqs)
        if token_bitmask is not None:
            logits = apply_token_bitmask(logits, token_bitmask)
        adjusted = logits  # what logprobs are read from: bias, grammar and penalties, not the min_tokens ban
        logits = mask_min_new_tokens(logits, reqs)
        token_ids = self._sample(logits, reqs).long()
        out = DeviceSample(token_ids=token_ids, nan_rows=nan_rows)
        wanted, top = logprobs_wanted(reqs)
        if wanted:
            if self.applies_penalties and needs_penalties(reqs):
                # the distribution the token is drawn from has the penalties in it (a backend that applies
                # them does so first in its _sample), and OpenAI's logprobs are of that distribution
                adjusted = apply_penalties(adjusted, reqs)
            out.logprobs, out.top_ids, out.top_logprobs = read_logprobs(adjusted, token_ids, top)
        return out

    @abstractmethod
    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        """[S, V] logits -> [S] int64 token ids."""

    def warm_up(self, vocab_size: int) -> float:
        """Sample once from random logits with the settings of a typical request (temperature, top-k, top-p,
        a seeded row), so the backend's kernels load or compile at start-up: FlashInfer's sampling family
        compiled for ~100 s at the first sampled token on a fresh H200, and a scheduler that silent is taken
        for hung (the server's warm-up request failed as stalled, and the server restarted in a loop).
        Returns the seconds it took."""
        started = time.monotonic()
        noise = torch.Generator(self.device).manual_seed(0)  # the global generator is the requests'
        logits = torch.randn(2, vocab_size, device=self.device, dtype=torch.float32, generator=noise)
        # No min_p: a backend that ignores it warns once, and that warning belongs to a user's request.
        reqs = [
            _WarmUpRequest(SamplingParams(temperature=0.7, top_k=50, top_p=0.9)),
            _WarmUpRequest(SamplingParams(temperature=0.7, top_p=0.9, seed=0)),
        ]
        self.sample(logits, reqs).token_ids.tolist()  # waits for the device
        return time.monotonic() - started


@dataclass
class _WarmUpRequest:
    """A stand-in request for `Sampler.warm_up` (SamplingRequest is a protocol)."""

    sampling: SamplingParams
    generator: Any = None
    token_ids: list[int] = field(default_factory=lambda: [0])
    eos_token_ids: frozenset[int] = frozenset()
    num_prompt_tokens: int = 1
    num_output_tokens: int = 0


def mask_min_new_tokens(logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
    """Forbid stop tokens (and EOS unless ignore_eos) before a request reaches min_new_tokens."""
    rows, cols = [], []
    for i, r in enumerate(reqs):
        sp = r.sampling
        if r.num_output_tokens >= sp.min_new_tokens:
            continue
        banned = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(r.eos_token_ids))
        rows += [i] * len(banned)
        cols += sorted(banned)
    if not rows:
        return logits
    logits = logits.clone()
    logits[torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)] = float("-inf")
    return logits


class GreedySampler(Sampler):
    """Argmax; ignores temperature, top-k/p, penalties and seeds."""

    name = "greedy"
    applies_penalties = False

    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        return torch.argmax(logits, dim=-1)
