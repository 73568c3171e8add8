"""Scratch that CUDA graphs keep pointing at: a buffer that grows only outside a capture and keeps, alive,
every buffer it outgrows.

A captured graph holds raw addresses. If an eager batch larger than any captured one replaced a scratch
buffer and freed the old one, the allocator would hand that memory to another tensor, and the next replay
would write into it. So a `GraphScratch` grows only outside a capture (the runner's eager warm-up of each
captured batch size comes first, and a capture that would need to grow it raises) and keeps what it
outgrew. Its users: the Triton decode attention's split partials, and the arrival counts below.

Arrival counts (`ArrivalCounts`) are the int32 per output tile that a kernel's split programs count in, so
the last to arrive merges the partials (decode attention in one launch, the skinny GEMM's split K, the MoE
GEMV's split down kernel). Every launch leaves its counts at zero, so one buffer serves every layer of a
step and every captured graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class GraphScratch:
    def __init__(self, what: str, dtype: torch.dtype, zeroed: bool = False) -> None:
        self.what = what  # named in the error a capture that would have to grow it raises
        self.dtype = dtype
        self.zeroed = zeroed  # allocate zeros (arrival counts), or leave the memory as it comes
        self._buf: torch.Tensor | None = None
        self._outgrown: list[torch.Tensor] = []

    def at_least(
        self, n: int, device: torch.device, grow_to: Callable[[], int] | None = None
    ) -> torch.Tensor:
        """A flat buffer of at least `n` entries on `device`. When it must grow, it takes `grow_to()`
        entries (at least `n`): the size every batch up to the largest captured one needs, so that one
        growth in the warm-up serves all the graphs."""
        if self._buf is None or self._buf.numel() < n:
            if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"{self.what} must grow before a CUDA graph is captured (an eager run of the captured "
                    "batch size first)"
                )
            size = max(n, grow_to()) if grow_to is not None else n
            if self._buf is not None:
                self._outgrown.append(self._buf)
            make = torch.zeros if self.zeroed else torch.empty
            self._buf = make(size, dtype=self.dtype, device=device)
        return self._buf


class ArrivalCounts(GraphScratch):
    """int32 zeros that every launch leaves at zero."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: its arrival counts", torch.int32, zeroed=True)

    def all_zero(self) -> bool:
        """Whether every count, in outgrown buffers too, is back at zero (what each launch must leave)."""
        return all(int(c.abs().sum()) == 0 for c in (self._buf, *self._outgrown) if c is not None)
