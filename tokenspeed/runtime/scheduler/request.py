"""A request as the scheduler sees it.

There is no prefill or decode phase: a request has `num_tokens` (prompt + generated) and
`num_computed_tokens` (tokens whose K/V is in the cache). Each step computes some of the rest:

    token_ids:  [ p0 p1 p2 p3 p4 p5 | o0 o1 ]        num_tokens = 8
                 <-- computed -->  <- to compute ->   num_computed_tokens = 5

A prefill chunk computes several tokens; a decode computes the single last token. When a step computes
up to num_tokens, a new token is sampled and appended.

With overlap scheduling the next batch is scheduled while the device still runs the current one, so a
token can be sampled but not yet on the host: it is counted in `num_pending_tokens` (and so in
`num_tokens`, which is what scheduling sees) and appended to `token_ids` when its batch is resolved.

    token_ids:  [ p0 p1 p2 p3 p4 p5 | o0 ] + 1 pending    num_tokens = 8, num_output_tokens = 1
                 <------ computed ------>  <- next ->   num_computed_tokens = 7

`num_computed_tokens` counts the work of launched batches (the device computes in launch order), and
`epoch` changes whenever the request loses its KV state (preemption), so the result of a batch launched
before that carries no KV progress.
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
    grammar: Any = None  # its GrammarState (runtime/grammar) when its output is constrained

    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first admission, reported to the user
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    matched_stop: int | None = None
    error: str | None = None
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # With sampling.prompt_logprobs: per prompt token, [logprob, rank, [[id, logprob], ...]] once its
    # position's logits were computed (None before, and for the first token and those before
    # logprob_start_len). Indexed by position, so a chunk computed again after preemption rewrites it alike.
    prompt_logprobs: list[list | None] | None = field(init=False, default=None)
    num_emitted_tokens: int = 0  # outputs already sent to the front end
    num_preemptions: int = 0
    num_pending_tokens: int = 0  # sampled by launched batches, not yet on the host
    epoch: int = 0  # bumped on preemption
    # time.time() when a batch first included it (the end of its queue wait); a preempted request that is
    # scheduled again keeps it, so queue time is the wait before any work started.
    first_scheduled_time: float | None = None
    # Speculative tokens proposed to follow token_ids (runtime/speculative); its next decode verifies them.
    draft_ids: list[int] = field(default_factory=list)

    # KV state, owned by the KV cache manager
    row: int | None = None  # req_to_token row while running
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0  # leading pages already handed to the prefix cache (locked via cache_node)
    cache_node: Any = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)
        if self.sampling.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_ids)

    @property
    def prompt_logprobs_from(self) -> int:
        """The first prompt token whose logprob is returned (the first token has none to return)."""
        return max(1, self.sampling.logprob_start_len)

    def first_missing_prompt_logprob(self) -> int | None:
        """The first prompt token still without the logprob it asked for, or None."""
        if self.prompt_logprobs is None:
            return None
        for t in range(self.prompt_logprobs_from, len(self.prompt_ids)):
            if self.prompt_logprobs[t] is None:
                return t
        return None

    def prefix_match_limit(self) -> int:
        """How many leading tokens may come from the prefix cache. Never the last (the step computing it
        yields the logits to sample from), nor, while a prompt logprob is missing, the position before
        that token: a cached position has no logits (vLLM skips the cache hit for such requests too)."""
        limit = self.num_tokens - 1
        missing = self.first_missing_prompt_logprob()
        return limit if missing is None else min(limit, missing - 1)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Known and pending tokens: the length scheduling works with."""
        return len(self.token_ids) + self.num_pending_tokens

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens on the host (what the user has been or will be shown)."""
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def ends_by_length(self, max_model_len: int) -> bool:
        """Its tokens so far (pending included) reach max_new_tokens or max_model_len: it finishes when they
        reach the host, so computing one more would be wasted."""
        limit = self.sampling.max_new_tokens
        return (limit is not None and self.num_tokens - len(self.prompt_ids) >= limit) or (
            self.num_tokens >= max_model_len
        )

    def max_draft_tokens(self, max_model_len: int) -> int:
        """Drafts a decode may verify: every accepted one and the token after it must still be allowed."""
        room = max_model_len - self.num_tokens - 1
        limit = self.sampling.max_new_tokens
        if limit is not None:
            room = min(room, limit - (self.num_tokens - len(self.prompt_ids)) - 1)
        return max(room, 0)

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
        at_limit = sp.max_new_tokens is not None and n_out >= sp.max_new_tokens
        if at_limit or len(self.token_ids) >= max_model_len:
            self.finish("length")
