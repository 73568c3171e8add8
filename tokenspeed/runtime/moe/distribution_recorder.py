"""Expert-distribution recorder: how many tokens each (layer, physical expert) received.

Counting happens on the device, in the persistent buffers of `ExpertCounts`: the MoE layers' routing
adds each step's choices into `device_counts(layer)` (the fused router with atomics, inside captured
CUDA graphs too), and the runner calls `end_pass()` after each step, which is host bookkeeping only.
The host reads the window when asked: `metrics_counts` (asynchronously, at most every
`METRICS_INTERVAL_S`), `window_counts` (waits; EPLB and dumps).

Modes (the seed's names):
- stat: the load over the last `buffer_size` passes (-1 or None: since the window started).
- stat_approx: as stat; our counts are exact, the mode is kept so profiles written for it still load.
- per_pass: as stat, and `dump()` returns every pass in the buffer instead of their sum (a device copy
  of the cumulative counts per pass; still graph-safe).
- per_token: as per_pass, plus the routed expert ids of every token of every pass. Those ids are copied
  to the host from inside the forward, which a CUDA graph cannot do: servers in this mode decode eagerly
  (`device_counts` is None and the layers call `record` instead).

A captured graph counts on every replay whether or not anyone records; recording on and off is kept by
the window: `start` restarts it, and the load of a stopped session is frozen at `stop`.

Who keeps it on. A user records a session (`start` .. `stop`, the /start|stop_expert_distribution_record
routes). `--enable-eplb` and `--enable-expert-distribution-metrics` need the load all the time: the
recorder is then `kept_by` that flag (`ExpertPlan.kept_by`) and counts with or without a session. `stop`
always ends the session and freezes what `dump` returns (the load between start and stop); a kept
recorder goes on counting into its window, which metrics and EPLB read.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenspeed.runtime.moe.expert_counts import ExpertCounts

MODES = ("stat", "stat_approx", "per_pass", "per_token")
# How old the expert load exported as metrics may be: the host copies it at most this often.
METRICS_INTERVAL_S = 1.0


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
        # None or -1 means unbounded: the window then runs from its start.
        self.buffer_size = None if buffer_size in (None, -1) else int(buffer_size)
        self.state = RecorderState(kept_by=kept_by)
        self.counts = ExpertCounts(num_layers, num_physical_experts, self.device, self.buffer_size)
        self._frozen: dict | None = None  # what `dump` returns once a session stopped
        self._stopped: torch.Tensor | None = None  # the window when recording last went off
        self._passes: deque[torch.Tensor] = deque(
            maxlen=None if self.buffer_size is None else self.buffer_size + 1
        )
        self._tokens: deque[list[torch.Tensor | None]] = deque(maxlen=self.buffer_size)
        self._current_tokens: list[torch.Tensor | None] = [None] * num_layers

    @property
    def graph_safe(self) -> bool:
        """Whether a captured CUDA graph can do all of this mode's recording (all but per_token)."""
        return self.mode != "per_token"

    # ---- called from the forward -------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self.state.recording

    def device_counts(self, layer_id: int) -> torch.Tensor | None:
        """The int32 counts row the layer's routing adds into; None: call `record` with the ids."""
        return self.counts.row(layer_id) if self.graph_safe else None

    def record(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        """Count on the host's call (per_token mode, or a layer without a device sink)."""
        if not self.state.recording:
            return
        self.counts.add(layer_id, topk_ids)
        if self.mode == "per_token":
            self._current_tokens[layer_id] = topk_ids.detach().to("cpu", non_blocking=True)

    def end_pass(self) -> None:
        if not self.state.recording:
            return
        self.state.passes += 1
        self.counts.end_pass()
        if self.mode in ("per_pass", "per_token"):
            if not self._passes:
                self._passes.append(self.counts.window_start().clone())
            self._passes.append(self.counts.cumulative())
        if self.mode == "per_token":
            self._tokens.append(self._current_tokens)
            self._current_tokens = [None] * self.num_layers

    # ---- control (HTTP endpoints, EPLB) --------------------------------------------------------
    def start(self) -> None:
        self.reset()
        self._frozen = None
        self._stopped = None
        self.state.session = True
        self.state.started_at = time.time()

    def stop(self) -> None:
        """End the user's session: later dumps hold its load even if the window moves on (kept, EPLB)."""
        if self.state.session:
            self._frozen = self._collect()
            if self.state.kept_by is None:
                self._stopped = self.counts.current()
        self.state.session = False

    def keep(self, reason: str) -> None:
        """Count on every step from now on, with or without a session."""
        self.state.kept_by = reason
        self._stopped = None

    def reset(self) -> None:
        self.counts.restart()
        self._passes.clear()
        self._tokens.clear()
        self.state.passes = 0
        if self._stopped is not None:
            self._stopped = torch.zeros_like(self._stopped)

    def window_counts(self) -> torch.Tensor:
        """Tokens per (layer, physical expert) over the recorded window, on the CPU (waits)."""
        if self._stopped is not None and not self.state.recording:
            return self._stopped.cpu()
        return self.counts.read()

    def metrics_counts(self, max_age_s: float = METRICS_INTERVAL_S) -> torch.Tensor:
        """The window for metrics: no wait, at most `max_age_s` old (see ExpertCounts.read_async)."""
        if self._stopped is not None and not self.state.recording:
            return self._stopped.cpu()
        return self.counts.read_async(max_age_s)

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
            snaps = list(self._passes)
            out["per_pass"] = [(b - a).cpu() for a, b in zip(snaps, snaps[1:], strict=False)]
        if self.mode == "per_token":
            out["per_token"] = [list(t) for t in self._tokens]
        return out
