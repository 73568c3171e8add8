"""Tokens per (layer, physical expert) counted on the device, in buffers a CUDA graph can keep writing.

The routing adds into `live` (int32 [layers, slots]): atomics in the fused router, `index_add_` in the
reference. `live` is allocated once and never replaced, so a captured decode step keeps counting into it
on every replay, and nothing about counting depends on host state frozen at capture time.

Everything else is bookkeeping between steps, on the device and without a host sync:

- the cumulative count is `acc + live`; every `FOLD_PASSES` passes `live` is folded into the int64 `acc`
  (int32 atomics never come near overflow);
- a window is the cumulative count now minus the cumulative count at its start: `restart` takes a copy
  (`base`); a window of the last N passes reads a ring of cumulative snapshots taken every
  ceil(N / 64) passes, so it covers N passes exactly when N <= 64 and at most N + N / 64 otherwise;
- the host reads a window with `read` (waits; EPLB, dumps) or `read_async`, which starts a copy to
  pinned memory at most every `max_age_s` and answers the last one that has landed (metrics).
"""

from __future__ import annotations

import math
import time

import torch

FOLD_PASSES = 1024
RING_SNAPSHOTS = 64


class ExpertCounts:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        device: torch.device | str = "cpu",
        window: int | None = None,
        fold_passes: int = FOLD_PASSES,
    ):
        self.device = torch.device(device)
        self.fold_passes = fold_passes
        shape = (num_layers, num_slots)
        self.live = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.acc = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.base = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.passes = 0  # passes counted since construction (the clock of the ring)
        self.base_pass = 0
        self.window = window
        self.stride = 1
        self.ring: torch.Tensor | None = None
        self.ring_pass: list[int] = []
        if window is not None:
            self.stride = max(1, math.ceil(window / RING_SNAPSHOTS))
            slots = math.ceil(window / self.stride) + 1
            self.ring = torch.zeros((slots, *shape), dtype=torch.int64, device=self.device)
            self.ring_pass = [-1] * slots
        self._pending: tuple[torch.Tensor, object, float] | None = None
        self._ready: tuple[torch.Tensor, float] | None = None

    # ---- counting --------------------------------------------------------------------------------
    def row(self, layer_id: int) -> torch.Tensor:
        """The persistent int32 counts of one layer, for the fused router to add into."""
        return self.live[layer_id]

    def add(self, layer_id: int, ids: torch.Tensor) -> None:
        flat = ids.reshape(-1).to(torch.int64)
        self.live[layer_id].index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))

    def end_pass(self) -> None:
        self.passes += 1
        if self.passes % self.fold_passes == 0:
            self.acc += self.live
            self.live.zero_()
        if self.ring is not None and self.passes % self.stride == 0:
            i = (self.passes // self.stride) % len(self.ring_pass)
            torch.add(self.acc, self.live, out=self.ring[i])
            self.ring_pass[i] = self.passes

    # ---- windows ---------------------------------------------------------------------------------
    def cumulative(self) -> torch.Tensor:
        return self.acc + self.live

    def restart(self) -> None:
        """The window starts now (device copy into the persistent `base`)."""
        torch.add(self.acc, self.live, out=self.base)
        self.base_pass = self.passes
        self.ring_pass = [-1] * len(self.ring_pass)
        self._pending = self._ready = None  # a copy of the old window must not answer for the new one

    def window_start(self) -> torch.Tensor:
        if self.window is None or self.ring is None:
            return self.base
        want = self.passes - self.window  # the latest snapshot at or before this pass
        best = None
        for i, p in enumerate(self.ring_pass):
            if self.base_pass <= p <= want and (best is None or p > self.ring_pass[best]):
                best = i
        return self.base if best is None else self.ring[best]

    def current(self) -> torch.Tensor:
        """The window on the device (a new tensor)."""
        return self.cumulative() - self.window_start()

    def read(self) -> torch.Tensor:
        """The window on the host, waiting for the device."""
        return self.current().cpu()

    def read_async(self, max_age_s: float) -> torch.Tensor:
        """The window as of the last finished copy; a new copy starts when that one is `max_age_s` old.
        Only the first call waits for the device."""
        if self.device.type != "cuda":
            return self.read()
        now = time.monotonic()
        if self._pending is not None and self._pending[1].query():
            host, _, started = self._pending
            self._ready = (host, started)
            self._pending = None
        if self._pending is None and (self._ready is None or now - self._ready[1] >= max_age_s):
            host = torch.empty(self.live.shape, dtype=torch.int64, pin_memory=True)
            host.copy_(self.current(), non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._pending = (host, done, now)
        if self._ready is None:
            host, done, started = self._pending
            done.synchronize()
            self._ready = (host, started)
            self._pending = None
        return self._ready[0]
