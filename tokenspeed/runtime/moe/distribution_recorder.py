"""Expert-distribution recorder: how many tokens each (layer, physical expert) received.

The MoE layers call `record(layer_id, topk_physical_ids)` during the forward; the runner calls
`end_pass()` after each step. Counting stays on the device (index_add into a [layers, experts] tensor),
so recording costs no host sync per layer; the host reads the window only when asked (metrics, EPLB,
dumps).

Modes (the seed's names):
- stat: per-pass count matrices in a ring buffer of `buffer_size` passes (-1: unbounded running total).
- stat_approx: as stat; our counts are exact, the mode is kept so profiles written for it still load.
- per_pass: as stat, and `dump()` returns every pass in the buffer instead of their sum.
- per_token: as per_pass, plus the routed expert ids of every token of every pass.

Who keeps it on. A user records a session (`start` .. `stop`, the /start|stop_expert_distribution_record
routes). `--enable-eplb` and `--enable-expert-distribution-metrics` need the load all the time: the recorder
is then `kept_by` that flag (`recording_policy`) and counts with or without a session. `stop` always ends the session and freezes
what `dump` returns (the load between start and stop); a kept recorder goes on counting into its window,
which metrics and EPLB read.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

MODES = ("stat", "stat_approx", "per_pass", "per_token")


@dataclass
class RecorderState:
    session: bool = False  # between a user's start and stop
    kept_by: str | None = None  # why it counts without a session (a flag that reads the load)
    started_at: float | None = None
    passes: int = 0
    dumps: list[str] = field(default_factory=list)

    @property
    def recording(self) -> bool:
        return self.session or self.kept_by is not None


class ExpertDistributionRecorder:
    def __init__(
        self,
        mode: str,
        num_layers: int,
        num_physical_experts: int,
        buffer_size: int | None = None,
        device: torch.device | str = "cpu",
        kept_by: str | None = None,
    ):
        if mode not in MODES:
            raise ValueError(
                f"--expert-distribution-recorder-mode {mode!r} is not known; choose one of {list(MODES)}"
            )
        if buffer_size is not None and buffer_size == 0:
            raise ValueError("--expert-distribution-recorder-buffer-size must be -1 (unbounded) or > 0")
        self.mode = mode
        self.num_layers = num_layers
        self.num_experts = num_physical_experts
        self.device = torch.device(device)
        # None or -1 means unbounded: the sum of stat modes is then kept as one running total.
        self.buffer_size = None if buffer_size in (None, -1) else int(buffer_size)
        self.state = RecorderState(kept_by=kept_by)
        self._frozen: dict | None = None  # what `dump` returns once a session stopped
        self._current = torch.zeros((num_layers, num_physical_experts), dtype=torch.int64, device=self.device)
        self._passes: deque[torch.Tensor] = deque(maxlen=self.buffer_size)
        self._tokens: deque[list[torch.Tensor | None]] = deque(maxlen=self.buffer_size)
        self._current_tokens: list[torch.Tensor | None] = [None] * num_layers
        self._total = torch.zeros_like(self._current)

    # ---- called from the forward -------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self.state.recording

    def record(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        if not self.state.recording:
            return
        flat = topk_ids.reshape(-1).to(torch.int64)
        self._current[layer_id].index_add_(0, flat, torch.ones_like(flat))
        if self.mode == "per_token":
            self._current_tokens[layer_id] = topk_ids.detach().to("cpu", non_blocking=True)

    def end_pass(self) -> None:
        if not self.state.recording:
            return
        self.state.passes += 1
        if self.buffer_size is None and self.mode in ("stat", "stat_approx"):
            self._total += self._current
        else:
            self._passes.append(self._current.clone())
            if self.mode == "per_token":
                self._tokens.append(self._current_tokens)
                self._current_tokens = [None] * self.num_layers
        self._current.zero_()

    # ---- control (HTTP endpoints, EPLB) --------------------------------------------------------
    def start(self) -> None:
        self.reset()
        self._frozen = None
        self.state.session = True
        self.state.started_at = time.time()

    def stop(self) -> None:
        """End the user's session: later dumps hold its load even if the window moves on (kept, EPLB)."""
        if self.state.session:
            self._frozen = self._collect()
        self.state.session = False

    def keep(self, reason: str) -> None:
        """Count on every step from now on, with or without a session."""
        self.state.kept_by = reason

    def reset(self) -> None:
        self._current.zero_()
        self._total.zero_()
        self._passes.clear()
        self._tokens.clear()
        self.state.passes = 0

    def window_counts(self) -> torch.Tensor:
        """Tokens per (layer, physical expert) over the recorded window, on the CPU."""
        total = self._total.clone()
        for p in self._passes:
            total += p
        return total.cpu()

    def dump(self, path: str | Path | None = None) -> dict:
        """The recorded distribution as plain data; also written to `path` (torch.save) when given.

        After a stop: the stopped session's load; else the live window."""
        out = self._frozen if self._frozen is not None else self._collect()
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(out, path)
            self.state.dumps.append(str(path))
        return out

    def _collect(self) -> dict:
        out: dict = {
            "mode": self.mode,
            "passes": self.state.passes,
            "num_layers": self.num_layers,
            "num_physical_experts": self.num_experts,
            "logical_count": self.window_counts(),
        }
        if self.mode in ("per_pass", "per_token"):
            out["per_pass"] = [p.cpu() for p in self._passes]
        if self.mode == "per_token":
            out["per_token"] = [list(t) for t in self._tokens]
        return out
