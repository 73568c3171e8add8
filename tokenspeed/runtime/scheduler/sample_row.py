"""SampleRow: a request as the sampler reads it for one output position.

The output position may run ahead of the request's host tokens: under overlap scheduling by the tokens still
in flight (`num_output_tokens` counts them), and in a speculative verify step by the drafts before the
position (`drafts`: penalties count them as the request's tokens, min_new_tokens as outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenspeed.runtime.scheduler.request import Request


@dataclass(frozen=True)
class SampleRow:
    req: Request
    num_output_tokens: int
    drafts: tuple[int, ...] = ()

    @property
    def sampling(self):
        return self.req.sampling

    @property
    def generator(self):
        return self.req.generator

    @property
    def token_ids(self) -> list[int]:
        return [*self.req.token_ids, *self.drafts] if self.drafts else self.req.token_ids

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.req.eos_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return self.req.num_prompt_tokens
