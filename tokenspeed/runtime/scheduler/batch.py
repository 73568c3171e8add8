"""ScheduledBatch: the only thing the scheduler hands to the model runner.

Items are in the order the runner lays tokens out in the ForwardBatch. Item i computes tokens
`req.token_ids[start : start + num_new_tokens]` at positions `start ...` where `start` is the request's
`num_computed_tokens` at scheduling time; the runner samples a token for the item when `sample` is set
(the chunk reaches the end of the request's tokens).

Under overlap scheduling the input of a decode may be the token its request sampled in the batch still on
the device (`req.token_ids` ends before `start`): the runner takes it from that batch's device output.

With speculative decoding a decode item also carries `draft_ids`: its forward computes the last token and the
drafts after it (`num_new_tokens` = 1 + len(draft_ids)), the runner verifies them, and its result is a
`VerifiedRun` of one or more tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenspeed.runtime.scheduler.request import Request


@dataclass
class ScheduledRequest:
    req: Request
    start: int
    num_new_tokens: int  # every token the forward computes, drafts included
    draft_ids: list[int] = field(default_factory=list)  # speculative tokens after the last known one
    sample: bool = field(init=False)  # fixed at scheduling time; the request grows once sampled
    output_index: int = field(init=False)  # which output token the item samples (0 = the first)
    epoch: int = field(init=False)  # the request's epoch at scheduling time

    def __post_init__(self) -> None:
        self.sample = self.start + self.num_new_tokens - len(self.draft_ids) == self.req.num_tokens
        self.output_index = self.req.num_tokens - self.req.num_prompt_tokens
        self.epoch = self.req.epoch

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.sample


@dataclass
class VerifiedRun:
    """What a verify forward emits for one item: the accepted drafts then the target's own token."""

    tokens: list[int]  # 1 .. num_drafted + 1 tokens
    num_drafted: int
    logprobs: list[float] | None = None  # per token, when the request asked for logprobs
    top_logprobs: list[list[tuple[int, float]]] | None = None

    @property
    def num_accepted(self) -> int:
        return len(self.tokens) - 1


@dataclass
class ScheduledBatch:
    items: list[ScheduledRequest] = field(default_factory=list)
    num_preempted: int = 0  # requests preempted while building this batch

    @property
    def num_tokens(self) -> int:
        return sum(it.num_new_tokens for it in self.items)

    @property
    def is_empty(self) -> bool:
        return not self.items

    @property
    def has_drafts(self) -> bool:
        return any(it.draft_ids for it in self.items)

    @property
    def is_decode_only(self) -> bool:
        return bool(self.items) and all(it.is_decode for it in self.items)
