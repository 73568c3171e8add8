"""A rank's MoE experts: the expert-distribution recorder, the EPLB manager and their control calls.

`RankExperts` manages them when the server asks for expert parallelism, redundant experts, recording or
EPLB; `NoExperts` is the single-rank null object (no recorder; every expert control call is refused with
the flag that enables it), so the engine and the runner never test for "are there experts".

Control operations (recorder start/stop/reset, a rebalance) are applied on rank 0 at once and queued for
its peers (`take_ops`), which apply them from the next decision (`apply_ops`), so every rank changes
between the same two steps.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from tokenspeed.config.slices import ExpertPlan
from tokenspeed.runtime.engine.io_struct import ControlRefused
from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.eplb_manager import HOW_TO_ENABLE, EPLBManager, rebalance_unavailable
from tokenspeed.runtime.moe.expert_parallel import ExpertParallelState, ParallelMoeBlock
from tokenspeed.runtime.moe.expert_stats import ExpertLoadSnapshot, expert_load_snapshot
from tokenspeed.runtime.moe.placement_view import placement_answer
from tokenspeed.runtime.moe.sparse_block import SparseMoeBlock

logger = logging.getLogger(__name__)

RECORDER_OPS = ("start", "stop", "reset")
EXPERT_RECORD_METHODS = (
    "start_expert_distribution_record",
    "stop_expert_distribution_record",
    "dump_expert_distribution_record",
    # read-only: where the experts are and what the last rebalance changed (GET /expert_placement)
    "expert_placement",
)
# One wording for "this server records no expert load", whichever rank layout answers.
RECORDING_NOT_ENABLED = (
    "expert distribution recording is not enabled in this server: it needs a MoE model and "
    "--expert-distribution-recorder-mode (or --enable-expert-distribution-metrics)"
)


class ExpertController(Protocol):
    """What the engine and the model runner ask of a rank's experts."""

    recorder: ExpertDistributionRecorder | None

    def attach(
        self, model: nn.Module, model_config: Any, state: ExpertParallelState | None, device: torch.device
    ) -> None: ...
    def after_forward(self) -> None: ...
    def take_ops(self, rebalance: bool = True) -> list[list[Any]]: ...
    def apply_ops(self, ops: list[list[Any]], from_leader: bool = False) -> None: ...
    def has_pending(self) -> bool: ...
    def snapshot(self, fresh: bool = False) -> ExpertLoadSnapshot | None: ...
    def control(self, method: str, args: dict[str, Any], dp_rank: int) -> dict[str, Any]: ...
    def request_rebalance(self) -> None: ...
    def rebalance_answer(self) -> dict[str, Any]: ...


class NoExperts:
    """A rank without expert management: nothing records, nothing rebalances."""

    recorder: ExpertDistributionRecorder | None = None

    def attach(self, model: nn.Module, model_config: Any, state: Any, device: torch.device) -> None:
        return None

    def after_forward(self) -> None:
        return None

    def take_ops(self, rebalance: bool = True) -> list[list[Any]]:
        return []

    def apply_ops(self, ops: list[list[Any]], from_leader: bool = False) -> None:
        return None

    def has_pending(self) -> bool:
        return False

    def snapshot(self, fresh: bool = False) -> ExpertLoadSnapshot | None:
        return None

    def control(self, method: str, args: dict[str, Any], dp_rank: int) -> dict[str, Any]:
        if method == "expert_placement":
            return self.placement()
        raise ControlRefused(f"{method}: {RECORDING_NOT_ENABLED}")

    def request_rebalance(self) -> None:
        raise ControlRefused(f"this server cannot rebalance experts; {HOW_TO_ENABLE}")

    def rebalance_answer(self) -> dict[str, Any]:
        raise ControlRefused(f"this server cannot rebalance experts; {HOW_TO_ENABLE}")

    def placement(self) -> dict[str, Any]:
        raise ControlRefused(f"this server places no experts: it serves no MoE model ({HOW_TO_ENABLE})")


class RankExperts:
    """The recorder and EPLB manager of one rank, set up once its model is loaded (`attach`)."""

    def __init__(self, plan: ExpertPlan, is_leader: bool, nnodes: int):
        self.plan = plan
        self.is_leader = is_leader
        self.nnodes = nnodes
        self.state: ExpertParallelState | None = None
        self.recorder: ExpertDistributionRecorder | None = None
        self.eplb: EPLBManager | None = None
        self.moe_layers: list[int] = []
        self.num_logical_experts = 0
        self._pending: list[list[Any]] = []
        self._rebalance_due = False

    def attach(
        self, model: nn.Module, model_config: Any, state: ExpertParallelState | None, device: torch.device
    ) -> None:
        plan = self.plan
        self.state = state
        self.moe_layers = sorted(
            m.layer_id for m in model.modules() if isinstance(m, (SparseMoeBlock, ParallelMoeBlock))
        )
        self.num_logical_experts = int(model_config.num_experts or 0)
        # an expert-parallel placement can be rebalanced on demand, from a recorded load
        if not self.moe_layers or not (plan.wants_recorder or plan.enable_eplb or state is not None):
            if plan.enable_eplb:
                logger.warning("--enable-eplb ignored: %s has no MoE layers", model_config.architecture)
            return
        slots = state.location.num_physical if state is not None else self.num_logical_experts
        self.recorder = ExpertDistributionRecorder(
            plan.recorder_mode or "stat",
            model_config.num_layers,
            slots,
            plan.recorder_buffer_size,
            device,
            kept_by=plan.kept_by,
        )
        if state is None:
            if plan.enable_eplb:
                logger.warning(
                    "--enable-eplb: nothing to move with one EP rank and no redundant experts; set --ep-size "
                    "or --ep-num-redundant-experts"
                )
            return
        # without --enable-eplb the placement only changes on request (POST /rebalance_experts)
        self.eplb = EPLBManager(
            state,
            self.recorder,
            plan.num_redundant_experts,
            plan.rebalance_num_iterations,
            plan.eplb_algorithm,
            num_nodes=self.nnodes,
            periodic=plan.enable_eplb,
        )

    def after_forward(self) -> None:
        if self.recorder is not None:
            self.recorder.end_pass()
        if self.eplb is not None and self.eplb.step_done() and self.is_leader:
            self._rebalance_due = True

    # ---- control operations, applied by every rank between the same two steps ---------------------
    def has_pending(self) -> bool:
        return bool(self._pending)

    def take_ops(self, rebalance: bool = True) -> list[list[Any]]:
        """Rank 0: the operations its peers apply with the next decision (a due rebalance with `rebalance`)."""
        ops, self._pending = self._pending, []
        if self._rebalance_due and rebalance:
            ops.append(["rebalance"])
            self._rebalance_due = False
        return ops

    def apply_ops(self, ops: list[list[Any]], from_leader: bool = False) -> None:
        for op in ops:
            if op[0] == "record" and from_leader:
                self._recorder_apply(op[1])
            elif op[0] == "rebalance" and self.eplb is not None:
                self.eplb.rebalance()

    def _recorder_op(self, method: str, op: str) -> None:
        """Start, stop or reset recording now on rank 0, and on the peers with the next decision."""
        if self.recorder is None:
            raise ControlRefused(f"{method}: {RECORDING_NOT_ENABLED}")
        self._recorder_apply(op)
        self._pending.append(["record", op])

    def _recorder_apply(self, op: str) -> None:
        if op not in RECORDER_OPS or self.recorder is None:
            return
        if op == "start":
            self.recorder.start()
        elif op == "stop":
            # ends the user's session; a recorder kept on for metrics or EPLB goes on counting
            self.recorder.stop()
        else:
            self.recorder.reset()

    def request_rebalance(self) -> None:
        """Rebalance before the next step; ControlRefused (the caller shows it) when it cannot."""
        if self.eplb is None:
            raise ControlRefused(rebalance_unavailable(self.moe_layers))
        self.eplb.check_can_rebalance()
        self._rebalance_due = True

    def rebalance_answer(self) -> dict[str, Any]:
        last = self.eplb.stats.last
        return {"rebalances": self.eplb.stats.rebalances, "last": None if last is None else vars(last)}

    def placement(self) -> dict[str, Any]:
        """Which slot of which EP rank holds which expert now, and what the last rebalance changed."""
        if not self.moe_layers:
            raise ControlRefused(f"this server places no experts: its model has no MoE layers ({HOW_TO_ENABLE})")
        stats = self.eplb.stats if self.eplb is not None else None
        last = vars(stats.last) if stats is not None and stats.last is not None else None
        return placement_answer(
            self.state.location if self.state is not None else None,
            self.moe_layers,
            self.num_logical_experts,
            stats.rebalances if stats is not None else 0,
            last,
        )

    # ---- the recording control calls (RpcRequest "method") ------------------------------------------
    def control(self, method: str, args: dict[str, Any], dp_rank: int) -> dict[str, Any]:
        if method == "expert_placement":
            return self.placement()
        if method == "start_expert_distribution_record":
            self._recorder_op(method, "start")
            return {"recording": True}
        if method == "stop_expert_distribution_record":
            self._recorder_op(method, "stop")
            return {"recording": self.recorder.recording, "passes": self.recorder.state.passes}
        if method == "dump_expert_distribution_record":
            return self._dump(args.get("dir"), dp_rank)
        raise ValueError(f"unknown control call {method!r}")

    def _dump(self, folder_arg: str | None, dp_rank: int) -> dict[str, Any]:
        """Write the recorded distribution (torch.save) and answer its logical counts."""
        recorder = self.recorder
        if recorder is None:
            raise ControlRefused(f"dump_expert_distribution_record: {RECORDING_NOT_ENABLED}")
        folder = Path(folder_arg) if folder_arg else Path(tempfile.gettempdir()) / "tokenspeed-expert-distribution"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"expert_distribution_dp{dp_rank}_{int(time.time() * 1000)}_{os.getpid()}.pt"
        out = recorder.dump(folder / name)
        snap = self.snapshot(fresh=True)
        eplb = self.eplb
        return {
            "path": str(folder / name),
            "mode": out["mode"],
            "passes": out["passes"],
            "layers": snap.layers,
            "logical_count": snap.load,
            "rank_load": snap.rank_load,
            "balancedness": snap.balancedness,
            "num_rebalances": 0 if eplb is None else eplb.stats.rebalances,
            "rebalances": [] if eplb is None else [vars(r) for r in eplb.stats.history],
        }

    def snapshot(self, fresh: bool = False) -> ExpertLoadSnapshot | None:
        """The expert load; for metrics (the default) the recorder's last asynchronous read, at most
        a second old, so exporting never waits on the device; `fresh` waits for the current window."""
        if self.recorder is None:
            return None
        state = self.state
        counts = self.recorder.window_counts() if fresh else self.recorder.metrics_counts()
        snap = expert_load_snapshot(
            counts,
            self.moe_layers,
            state.location.placement.phy2log if state is not None else None,
            self.num_logical_experts,
            state.group.size if state is not None else 1,
        )
        snap.rebalances = self.eplb.stats.rebalances if self.eplb is not None else 0
        snap.rebalance_seconds = round(self.eplb.stats.seconds, 6) if self.eplb is not None else 0.0
        snap.recording = self.recorder.recording
        snap.passes = self.recorder.state.passes
        return snap
