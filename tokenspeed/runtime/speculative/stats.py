"""Counts of verification outcomes, for the spec_decode_* metrics and the engine's stats."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from tokenspeed.runtime.scheduler.batch import VerifiedRun


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0  # verify forwards of a request with drafts (cumulative)
    num_draft_tokens: int = 0  # drafted tokens verified (cumulative)
    num_accepted_tokens: int = 0  # drafted tokens accepted (cumulative)
    # accepted_per_pos[j]: verifications whose draft at position j was accepted (cumulative)
    accepted_per_pos: list[int] = field(default_factory=list)
    # tokens emitted per verification (accepted + 1) since the last snapshot
    acceptance_lengths: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=4096))

    def record(self, run: VerifiedRun) -> None:
        if run.num_drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += run.num_drafted
        self.num_accepted_tokens += run.num_accepted
        self.acceptance_lengths.append(run.num_accepted + 1)
        if len(self.accepted_per_pos) < run.num_drafted:
            self.accepted_per_pos.extend([0] * (run.num_drafted - len(self.accepted_per_pos)))
        for j in range(run.num_accepted):
            self.accepted_per_pos[j] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify forward of a drafted request: 1 + accepted / drafts (vLLM's definition)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def drain_lengths(self) -> list[int]:
        out = list(self.acceptance_lengths)
        self.acceptance_lengths.clear()
        return out
