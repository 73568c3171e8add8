"""What a sampler reads from a request: below the samplers, penalties and GPU parameter packing, which
all take a batch of them.
"""

from __future__ import annotations

from typing import Any, Protocol

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
