"""Arrival counts: the int32 per output tile that a kernel's split programs count in, so the last to arrive
merges the partials (decode attention in one launch, the skinny GEMM's split K, the MoE GEMV's split down
kernel).

Every launch leaves its counts at zero, so one buffer serves every layer of a step and every captured
CUDA graph. It grows only outside a capture (the runner's eager warm-up of each captured batch size comes
first), and a buffer it outgrows is kept, not freed: graphs captured before still count in it, and its
memory handed back to the allocator would be another tensor's.
"""

from __future__ import annotations

import torch


class ArrivalCounts:
    def __init__(self, what: str) -> None:
        self.what = what  # named in the error a capture that would have to grow it raises
        self._counts: torch.Tensor | None = None
        self._outgrown: list[torch.Tensor] = []

    def at_least(self, n: int, device: torch.device) -> torch.Tensor:
        """Zeros of at least `n` entries on `device`."""
        if self._counts is None or self._counts.numel() < n:
            if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"{self.what}: its arrival counts must grow before a CUDA graph is captured (an eager "
                    "run of the captured batch size first)"
                )
            if self._counts is not None:
                self._outgrown.append(self._counts)
            self._counts = torch.zeros(n, dtype=torch.int32, device=device)
        return self._counts

    def all_zero(self) -> bool:
        """Whether every count is back at zero (what each launch must leave)."""
        return all(int(c.abs().sum()) == 0 for c in (self._counts, *self._outgrown) if c is not None)
