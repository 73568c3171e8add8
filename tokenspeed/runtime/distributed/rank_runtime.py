"""What one scheduler rank adds to the engine when it is one of several, or serves a MoE model's experts.

`RankRuntime` is handed to the `ModelRunner`, which calls it at four points: to load the model (sharded
for this rank), to size the KV cache (local KV heads; the smallest pool of the TP group, so slots chosen
by rank 0 exist on every peer), before each forward (rank 0 broadcasts the batch decision and pending
control operations) and after it (the expert recorder closes the pass; EPLB counts steps).

Peers of a TP group (`follow`) run no scheduler: they apply each decision and run the same forward.
Control operations (recorder start/stop/reset, an expert rebalance) travel inside the decisions, so every
rank applies them between the same two steps. While rank 0 is idle it sends an empty decision every
`KEEPALIVE_S` seconds, so a peer waiting for work never reaches the communicator's timeout.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch
from torch import nn

from tokenspeed.runtime.distributed.batch_sync import PageMirror, decode_batch, encode_batch
from tokenspeed.runtime.distributed.comm import broadcast_object, min_over_group
from tokenspeed.runtime.distributed.groups import ParallelGroups, init_parallel
from tokenspeed.runtime.distributed.tensor_parallel import MoEOptions, load_parallel_model, local_kv_heads
from tokenspeed.runtime.engine.io_struct import ControlRefused
from tokenspeed.runtime.layers.moe.expert_parallel import ParallelMoeBlock
from tokenspeed.runtime.layers.moe.sparse_block import SparseMoeBlock
from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.eplb_manager import EPLBManager, rebalance_unavailable
from tokenspeed.runtime.moe.expert_stats import ExpertLoadSnapshot, expert_load_snapshot
from tokenspeed.runtime.moe.recording_policy import recording_kept_by

logger = logging.getLogger(__name__)

KEEPALIVE_S = 5.0
RECORDER_OPS = ("start", "stop", "reset")


def needs_rank_runtime(server_args: Any) -> bool:
    """Whether a server needs more than the plain single-rank engine."""
    mapping = server_args.mapping
    return (
        mapping.attn_tp_size * mapping.attn_cp_size > 1
        or mapping.moe_ep_size > 1
        or bool(server_args.expert_distribution_recorder_mode)
        or bool(server_args.enable_expert_distribution_metrics)
        or bool(server_args.enable_eplb)
        or int(server_args.ep_num_redundant_experts or 0) > 0
    )


def dist_init_method(server_args: Any, nccl_port: int) -> str:
    """Where the ranks of a server meet: `--dist-init-addr` across nodes, else a port of this node."""
    addr = getattr(server_args, "dist_init_addr", None)
    if addr:
        from tokenspeed.config.ports import split_host_port

        host, port = split_host_port(addr)
        host = f"[{host}]" if ":" in host else host
        return f"tcp://{host}:{port}"
    return f"tcp://127.0.0.1:{nccl_port}"


class RankRuntime:
    def __init__(self, server_args: Any, groups: ParallelGroups):
        self.server_args = server_args
        self.groups = groups
        self.moe = MoEOptions.from_server_args(server_args)
        self.expert_state = None
        self.recorder: ExpertDistributionRecorder | None = None
        self.eplb: EPLBManager | None = None
        self.moe_layers: list[int] = []
        self.num_logical_experts = 0
        self.mirror: PageMirror | None = None
        self._pending: list[list[Any]] = []
        self._rebalance_due = False
        self._last_sent = time.monotonic()
        timeout = getattr(server_args, "distributed_timeout_seconds", None)
        # well inside the communicator's timeout, however short the user set it
        self.keepalive_s = min(KEEPALIVE_S, timeout / 3) if timeout else KEEPALIVE_S

    @classmethod
    def start(cls, server_args: Any, rank: int, device: torch.device | str, nccl_port: int) -> RankRuntime:
        """Join the server's torch.distributed world (when this rank has peers) and build its groups."""
        timeout = getattr(server_args, "distributed_timeout_seconds", None)
        groups = init_parallel(
            server_args.mapping, rank, dist_init_method(server_args, nccl_port), device, timeout
        )
        return cls(server_args, groups)

    @property
    def tp(self):
        return self.groups.attn_tp

    @property
    def is_leader(self) -> bool:
        return self.tp.is_first

    # ---- model runner hooks -------------------------------------------------------------------
    def load_model(self, model_config: Any, load_format: str, device: Any, seed: int | None) -> nn.Module:
        pm = load_parallel_model(model_config, self.groups, load_format, device, seed, self.moe)
        self.expert_state = pm.expert_state
        self._init_experts(pm.model, model_config, torch.device(device))
        return pm.model

    def local_model_config(self, model_config: Any) -> Any:
        """The config as one rank sees attention: its share of the query and KV heads."""
        tp = self.tp.size
        if tp == 1:
            return model_config
        return dataclasses.replace(
            model_config,
            num_heads=model_config.num_heads // tp,
            num_kv_heads=local_kv_heads(model_config.num_kv_heads, tp),
        )

    def agree_num_pages(self, num_pages: int) -> int:
        return min_over_group(num_pages, self.tp)

    def attach(self, runner: Any) -> None:
        self.mirror = PageMirror(runner.req_to_token.block_size)

    def before_forward(self, runner: Any, batch: Any) -> None:
        """Rank 0: send the step to the peers, then apply the control operations everyone applies."""
        ops = self._take_ops()
        if self.tp.size > 1:
            if self.mirror is None:
                self.attach(runner)
            broadcast_object({"ops": ops, "batch": encode_batch(batch, self.mirror)}, self.tp)
            self._last_sent = time.monotonic()
        self._apply_ops(ops)

    def after_forward(self) -> None:
        if self.recorder is not None:
            self.recorder.end_pass()
        if self.eplb is not None and self.eplb.step_done() and self.is_leader:
            self._rebalance_due = True

    # ---- rank 0 between steps ------------------------------------------------------------------
    def keepalive(self, rebalance: bool = False) -> None:
        """Rank 0, idle: flush pending control operations, and keep waiting peers from timing out.

        A rebalance that falls due by step count waits for the next step (the load it would serve);
        `rebalance=True` (an explicit request) runs it now.
        """
        if self.tp.size == 1 or not self.is_leader:
            if self._pending or rebalance:
                self._apply_ops(self._take_ops(rebalance))
            return
        if self._pending or rebalance or time.monotonic() - self._last_sent > self.keepalive_s:
            ops = self._take_ops(rebalance)
            broadcast_object({"ops": ops}, self.tp)
            self._last_sent = time.monotonic()
            self._apply_ops(ops)

    def stop_peers(self) -> None:
        if self.tp.size > 1 and self.is_leader:
            broadcast_object({"stop": True}, self.tp)

    def recorder_op(self, op: str) -> None:
        """Start, stop or reset recording now on rank 0, and on the peers with the next decision."""
        if self.recorder is None:
            raise ValueError(
                "expert distribution recording is not enabled: it needs a MoE model and "
                "--expert-distribution-recorder-mode (or --enable-expert-distribution-metrics)"
            )
        self._recorder_apply(op)
        self._pending.append(["record", op])

    def request_rebalance(self) -> None:
        """Rebalance before the next step; ControlRefused (the caller shows it) when it cannot."""
        if self.eplb is None:
            raise ControlRefused(rebalance_unavailable(self.moe_layers))
        self.eplb.check_can_rebalance()
        self._rebalance_due = True

    def _take_ops(self, rebalance: bool = True) -> list[list[Any]]:
        ops, self._pending = self._pending, []
        if self._rebalance_due and rebalance:
            ops.append(["rebalance"])
            self._rebalance_due = False
        return ops

    def _apply_ops(self, ops: list[list[Any]], from_leader: bool = False) -> None:
        for op in ops:
            if op[0] == "record" and from_leader:
                self._recorder_apply(op[1])
            elif op[0] == "rebalance" and self.eplb is not None:
                self.eplb.rebalance()

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

    # ---- peers ----------------------------------------------------------------------------------
    def follow(self, runner: Any) -> None:
        """A peer's whole life: apply rank 0's decisions until it says stop."""
        self.attach(runner)
        while True:
            msg = broadcast_object(None, self.tp)
            if msg.get("stop"):
                return
            self._apply_ops(msg.get("ops") or [], from_leader=True)
            data = msg.get("batch")
            if data:
                self._peer_forward(runner, data)

    @torch.inference_mode()
    def _peer_forward(self, runner: Any, data: dict) -> None:
        batch = decode_batch(data, runner.req_to_token)
        fb = runner.prepare(batch)
        graphs = getattr(runner, "graph_runner", None)
        if graphs is not None and graphs.can_run(fb):
            graphs.replay(fb)
        else:
            runner.attn_backend.init_forward_metadata(fb)
            runner._forward(fb)
        self.after_forward()

    # ---- experts --------------------------------------------------------------------------------
    def _init_experts(self, model: nn.Module, model_config: Any, device: torch.device) -> None:
        args = self.server_args
        self.moe_layers = sorted(
            m.layer_id for m in model.modules() if isinstance(m, (SparseMoeBlock, ParallelMoeBlock))
        )
        self.num_logical_experts = int(model_config.num_experts or 0)
        state = self.expert_state
        wants = args.expert_distribution_recorder_mode or args.enable_expert_distribution_metrics
        # an expert-parallel placement can be rebalanced on demand, from a recorded load
        if not self.moe_layers or not (wants or args.enable_eplb or state is not None):
            if args.enable_eplb:
                logger.warning("--enable-eplb ignored: %s has no MoE layers", model_config.architecture)
            return
        slots = state.location.num_physical if state is not None else self.num_logical_experts
        kept_by = recording_kept_by(args)
        self.recorder = ExpertDistributionRecorder(
            args.expert_distribution_recorder_mode or "stat",
            model_config.num_layers,
            slots,
            args.expert_distribution_recorder_buffer_size,
            device,
            kept_by=kept_by,
        )
        if state is None:
            if args.enable_eplb:
                logger.warning(
                    "--enable-eplb: nothing to move with one EP rank and no redundant experts; set --ep-size "
                    "or --ep-num-redundant-experts"
                )
            return
        # without --enable-eplb the placement only changes on request (POST /rebalance_experts)
        self.eplb = EPLBManager(
            state,
            self.recorder,
            self.moe.num_redundant_experts,
            int(getattr(args, "eplb_rebalance_num_iterations", 1000) or 1000),
            self.moe.eplb_algorithm,
            num_nodes=self.groups.mapping.nnodes,
            periodic=bool(args.enable_eplb),
        )

    def expert_snapshot(self) -> ExpertLoadSnapshot | None:
        if self.recorder is None:
            return None
        state = self.expert_state
        snap = expert_load_snapshot(
            self.recorder.window_counts(),
            self.moe_layers,
            state.location.placement.phy2log if state is not None else None,
            self.num_logical_experts,
            state.group.size if state is not None else 1,
        )
        snap.rebalances = self.eplb.stats.rebalances if self.eplb is not None else 0
        snap.recording = self.recorder.recording
        snap.passes = self.recorder.state.passes
        return snap
