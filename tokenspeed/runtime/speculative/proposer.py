"""Draft proposers: after a step's tokens are applied, each request that will decode next gets its drafts.

A proposer sets `req.draft_ids` for the items of the step just resolved; the scheduler's next decode of the
request verifies them (scheduler/batch.py). Requests under a grammar get none: a grammar must accept each
token before it can say which may follow, so they decode one token per step.
"""

from __future__ import annotations

from typing import Protocol

from tokenspeed.runtime.scheduler.batch import ScheduledBatch
from tokenspeed.runtime.speculative.config import SpecConfig
from tokenspeed.runtime.speculative.ngram import propose_ngram


class DraftProposer(Protocol):
    def propose(self, batch: ScheduledBatch, launched: object) -> None:
        """Set `draft_ids` of the batch's live requests (`launched`: the step's LaunchedBatch)."""


class NgramProposer:
    def __init__(self, spec: SpecConfig):
        self.spec = spec

    def propose(self, batch: ScheduledBatch, launched: object = None) -> None:
        for it in batch.items:
            req = it.req
            if req.is_finished or not it.sample:
                continue  # a prefill chunk leaves the request's tokens (and any drafts) as they were
            if req.grammar is not None:
                req.draft_ids = []
                continue
            req.draft_ids = propose_ngram(
                req.token_ids, self.spec.num_drafted, self.spec.ngram_min, self.spec.ngram_max
            )


def create_proposer(spec: SpecConfig, runner: object, kv: object) -> DraftProposer:
    """The proposer of `spec.algorithm`; EAGLE3 loads its draft model beside the runner's target."""
    if spec.algorithm == "NGRAM":
        return NgramProposer(spec)
    from tokenspeed.runtime.speculative.eagle3_proposer import Eagle3Proposer

    return Eagle3Proposer(spec, runner, kv)
