"""Speculative-decoding metrics (vLLM's names under the tokenspeed: prefix), fed by StatsSnapshot.

    spec_decode_num_drafts            verify forwards of a request that carried drafts
    spec_decode_num_draft_tokens      drafted tokens verified
    spec_decode_num_accepted_tokens   drafted tokens accepted
    spec_decode_acceptance_length     histogram of tokens emitted per verification (accepted + 1)
    spec_decode_num_accepted_tokens_per_pos{position}   drafts accepted at each draft position

Mean acceptance length = 1 + accepted / drafts; the console computes it from the two counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenspeed.runtime.engine.io_struct import StatsSnapshot
from tokenspeed.runtime.metrics.families import MetricFamilies

_LENGTH_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


@dataclass
class _Last:
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0


class SpecDecodeMetrics:
    def __init__(self, families: MetricFamilies):
        self.counters = {
            "spec_num_drafts": families.counter(
                "spec_decode_num_drafts", "Verify forwards of requests with drafts."
            ),
            "spec_num_draft_tokens": families.counter(
                "spec_decode_num_draft_tokens", "Drafted tokens verified."
            ),
            "spec_num_accepted_tokens": families.counter(
                "spec_decode_num_accepted_tokens", "Drafted tokens accepted by verification."
            ),
        }
        self.acceptance_length = families.histogram(
            "spec_decode_acceptance_length",
            "Tokens emitted per verification of a drafted request (accepted drafts + 1).",
            _LENGTH_BUCKETS,
        )
        self.per_pos = families.counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Drafted tokens accepted, by their position in the draft (0 = first).",
            extra=("position",),
        )
        self._last: dict[int, _Last] = {}
        self._last_per_pos: dict[int, list[int]] = {}

    def observe(self, snap: StatsSnapshot, labels: dict[str, str]) -> None:
        last = self._last.setdefault(snap.dp_rank, _Last())
        for name, counter in self.counters.items():
            value = getattr(snap, name)
            delta = value - getattr(last, name)
            counter.labels(**labels).inc(delta if delta >= 0 else value)
            setattr(last, name, value)
        seen = self._last_per_pos.setdefault(snap.dp_rank, [])
        for pos, value in enumerate(snap.spec_accepted_per_pos):
            before = seen[pos] if pos < len(seen) else 0
            self.per_pos.labels(**labels, position=str(pos)).inc(max(value - before, 0))
        self._last_per_pos[snap.dp_rank] = list(snap.spec_accepted_per_pos)
        hist = self.acceptance_length.labels(**labels)
        for n in snap.spec_acceptance_lengths:
            hist.observe(n)
