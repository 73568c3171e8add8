"""The sampler interface: logits of the rows that sample this step -> one token id per row.

Backends implement `_sample`; the shared parts (min_new_tokens masking, logprobs of the chosen token,
`--enable-nan-detection`) live here so every backend behaves the same at the edges.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from tokenspeed.sampling_params import SamplingParams


class SamplingRequest(Protocol):
    """What a sampler reads from a request (the scheduler's Request satisfies it)."""

    sampling: SamplingParams
    generator: Any  # torch.Generator or None
    token_ids: list[int]
    eos_token_ids: frozenset[int]

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float] | None = None  # log-probability of each chosen token under the model
    nan_rows: list[bool] | None = None  # rows whose logits held NaN (only with NaN detection)


@dataclass
class DeviceSample:
    """The same, still on the device: the runner copies it to the host without waiting (overlap)."""

    token_ids: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None = None  # [S] float32
    nan_rows: torch.Tensor | None = None  # [S] bool


class Sampler(ABC):
    name: str = ""

    def __init__(self, device: torch.device | str, enable_nan_detection: bool = False):
        self.device = torch.device(device)
        self.enable_nan_detection = enable_nan_detection

    def __call__(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> SampleOutput:
        out = self.sample(logits, reqs)
        return SampleOutput(
            token_ids=out.token_ids.tolist(),
            logprobs=None if out.logprobs is None else out.logprobs.tolist(),
            nan_rows=None if out.nan_rows is None else out.nan_rows.tolist(),
        )

    def sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> DeviceSample:
        """Like calling the sampler, but the results stay on the device (no host sync of its own)."""
        nan_rows = None
        if self.enable_nan_detection:
            nan_rows = torch.isnan(logits).any(dim=-1)
            # Sample something harmless for those rows; the scheduler aborts them.
            logits = logits.masked_fill(nan_rows.unsqueeze(1), 0.0)
        raw = logits
        logits = _mask_min_new_tokens(logits, reqs)
        token_ids = self._sample(logits, reqs).long()
        logprobs = None
        if any(r.sampling.logprobs for r in reqs):
            logprobs = torch.log_softmax(raw.float(), dim=-1).gather(1, token_ids.unsqueeze(1)).squeeze(1)
        return DeviceSample(token_ids=token_ids, logprobs=logprobs, nan_rows=nan_rows)

    @abstractmethod
    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        """[S, V] logits -> [S] int64 token ids."""


def _mask_min_new_tokens(logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
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

    def _sample(self, logits: torch.Tensor, reqs: Sequence[SamplingRequest]) -> torch.Tensor:
        return torch.argmax(logits, dim=-1)
