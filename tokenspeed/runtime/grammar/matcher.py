"""One request's position in its grammar (xgrammar's matcher): fills its row of a step's bitmask, accepts each
sampled token."""

from __future__ import annotations

from typing import Any

import torch


def allow_only(bitmask: torch.Tensor, row: int, token_ids: list[int]) -> None:
    """Row `row` of a host int32 bitmask allows exactly `token_ids`."""
    bitmask[row].zero_()
    for tid in token_ids:
        bit = 1 << (tid % 32)
        bitmask[row, tid // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit  # int32 words


class GrammarState:
    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of a host int32 bitmask: the tokens the grammar allows next."""
        if self._matcher.is_terminated():
            # ignore_eos kept the request going past its completed grammar: only stop tokens may follow
            allow_only(bitmask, row, self._matcher.stop_token_ids)
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it (then it is unchanged)."""
        if self._matcher.is_terminated():
            return True  # the stop token was accepted; anything after it is dropped by the scheduler
        return bool(self._matcher.accept_token(token_id))
