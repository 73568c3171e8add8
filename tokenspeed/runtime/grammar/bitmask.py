"""A step's token bitmask: one row per sampling request, filled on the host, copied without waiting.

Rows of requests without a grammar allow every token. None when no request of the step has a grammar, so
an unconstrained step costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.grammar.matcher import GrammarState


def fill_token_bitmask(
    states: Sequence[GrammarState | None], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    if all(s is None for s in states):
        return None
    words = (vocab_size + 31) // 32
    host = torch.full((len(states), words), -1, dtype=torch.int32)
    if device.type == "cuda":
        host = host.pin_memory()
    for row, state in enumerate(states):
        if state is not None:
            state.fill(host, row)
    return host.to(device, non_blocking=True)
