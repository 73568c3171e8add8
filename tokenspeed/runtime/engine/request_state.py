"""What AsyncLLM tracks per request, and what it hands to the HTTP handlers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tokenspeed.runtime.engine.detokenizer import IncrementalDetokenizer
from tokenspeed.sampling_params import SamplingParams


@dataclass
class SequenceOutput:
    """What `generate()` yields: the deltas since the previous yield, and totals."""

    rid: str
    text: str
    token_ids: list[int]
    logprobs: list[float] | None
    finished: bool
    finish_reason: str | None
    matched_stop: str | int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    dp_rank: int
    error: str | None = None
    queue_time: float | None = None  # arrival to first scheduled (s); None until the scheduler reports it


@dataclass
class TrackedRequest:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    detok: IncrementalDetokenizer
    wake_every: int  # tokens between wake-ups; 0 = only at the end
    arrival: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    sent_any: bool = False
    finished: bool = False
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    dp_rank: int = 0
    rank_known: bool = False
    first_token: float | None = None
    first_scheduled: float | None = None  # the scheduler's wall-clock time, from RequestOutput
    last_token: float | None = None
    itl: list[float] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        """Arrival to first scheduled (s), None until the scheduler reports it; never negative (the
        scheduler's clock may be another node's)."""
        return None if self.first_scheduled is None else max(0.0, self.first_scheduled - self.arrival)

    def take(self) -> SequenceOutput:
        out = SequenceOutput(
            rid=self.rid,
            text="".join(self.text),
            token_ids=self.ids,
            logprobs=self.logprobs,
            finished=self.finished,
            finish_reason=self.finish_reason,
            matched_stop=self.matched_stop,
            prompt_tokens=self.prompt_tokens or len(self.input_ids),
            completion_tokens=len(self.detok.output_ids),
            cached_tokens=self.cached_tokens,
            dp_rank=self.dp_rank,
            error=self.error,
            queue_time=self.queue_time,
        )
        self.text, self.ids = [], []
        self.logprobs = [] if self.logprobs is not None else None
        return out


@dataclass
class ModelLimits:
    """From the schedulers' ready messages (the tightest over every rank)."""

    max_total_tokens: int
    max_req_input_len: int
    max_model_len: int
