"""What AsyncLLM tracks per request, and what it hands to the HTTP handlers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tokenspeed.runtime.engine.detokenizer import IncrementalDetokenizer
from tokenspeed.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestFailure:
    """Why a request ended other than by its own stop conditions or its client's abort, as its client is
    told: an HTTP status (500 an internal failure, 503 the server is shutting down, 400 refused by a
    scheduler), an OpenAI-style error code, and a message naming the cause."""

    status: int
    code: str
    message: str

    @classmethod
    def internal(cls, message: str, code: str = "internal_error") -> RequestFailure:
        return cls(500, code, message)

    @classmethod
    def shutdown(cls, message: str) -> RequestFailure:
        return cls(503, "server_shutdown", message)

    @classmethod
    def rejected(cls, message: str) -> RequestFailure:
        return cls(400, "invalid_request", message)

    @property
    def finish_reason(self) -> str:
        """What the request's last choice and request_success_total say: cut off ("abort") by a
        shutdown, "error" otherwise. Never "stop": a truncated answer must not look complete."""
        return "abort" if self.status == 503 else "error"


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
    failure: RequestFailure | None = None  # set on the final output of a request the server cut short
    queue_time: float | None = None  # arrival to first scheduled (s); None until the scheduler reports it
    # per token in token_ids, [token id, logprob] of the most likely tokens (with top_logprobs asked for)
    top_logprobs: list[list[list[float]]] | None = None
    # in the first output only, with sampling.prompt_logprobs: per prompt token, None (the first) or
    # [logprob, rank, [[token id, logprob], ...]] (RequestOutput.prompt_logprobs)
    prompt_logprobs: list[list | None] | None = None

    @property
    def error(self) -> str | None:
        return None if self.failure is None else self.failure.message


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
    top_logprobs: list[list[list[float]]] | None = None
    prompt_logprobs: list[list | None] | None = None  # until the output that carries them is taken
    sent_any: bool = False
    finished: bool = False
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    failure: RequestFailure | None = None
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
            failure=self.failure,
            queue_time=self.queue_time,
            top_logprobs=self.top_logprobs,
            prompt_logprobs=self.prompt_logprobs,
        )
        self.prompt_logprobs = None
        self.text, self.ids = [], []
        self.logprobs = [] if self.logprobs is not None else None
        self.top_logprobs = [] if self.top_logprobs is not None else None
        return out


@dataclass
class ModelLimits:
    """From the schedulers' ready messages (the tightest over every rank)."""

    max_total_tokens: int
    max_req_input_len: int
    max_model_len: int
