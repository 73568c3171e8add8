"""A request as the scheduler sees it.

There is no prefill or decode phase: a request has `num_tokens` (prompt + generated) and
`num_computed_tokens` (tokens whose K/V is in the cache). Each step computes some of the rest:

    token_ids:  [ p0 p1 p2 p3 p4 p5 | o0 o1 ]        num_tokens = 8
                 <-- computed -->  <- to compute ->   num_computed_tokens = 5

A prefill chunk computes several tokens; a decode computes the single last token. When a step computes
up to num_tokens, a new token is sampled and appended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tokenspeed.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    stream: bool = False
    arrival_time: float = 0.0
    generator: Any = None  # torch.Generator for a request with its own seed

    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first admission, reported to the user
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    matched_stop: int | None = None
    error: str | None = None
    output_logprobs: list[float] = field(default_factory=list)
    num_emitted_tokens: int = 0  # outputs already sent to the front end
    num_preemptions: int = 0

    # KV state, owned by the KV cache manager
    row: int | None = None  # req_to_token row while running
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0  # leading pages already handed to the prefix cache (locked via cache_node)
    cache_node: Any = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def finish(self, reason: str, matched_stop: int | None = None, error: str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.matched_stop = matched_stop
        self.error = error

    def append_token(self, token_id: int, max_model_len: int) -> None:
        """Append a sampled token and finish the request if it ends here."""
        self.token_ids.append(token_id)
        sp = self.sampling
        n_out = self.num_output_tokens
        if n_out >= sp.min_new_tokens:
            if token_id in sp.stop_token_ids or (not sp.ignore_eos and token_id in self.eos_token_ids):
                self.finish("stop", matched_stop=token_id)
                return
        if (sp.max_new_tokens is not None and n_out >= sp.max_new_tokens) or self.num_tokens >= max_model_len:
            self.finish("length")
