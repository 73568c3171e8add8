"""The engine of one scheduler rank when it has peers or experts to manage: an `EngineCore` plus its
`RankRuntime`, with the control calls the HTTP layer reaches through `RpcRequest`.

`build_rank_engine` is what a scheduler process calls: it joins the server's torch.distributed world,
builds the EngineCore around a runner that shards the model for this rank, and returns

- on rank 0 of a TP group: a `RankEngine` (the EngineCore API, plus `rpc_*` control calls and the
  expert-load figures in its stats snapshots), which the process's event loop drives as usual;
- on a peer: a `PeerEngine`, whose `follow()` runs rank 0's decisions until told to stop.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tokenspeed.runtime.distributed.groups import shutdown_parallel
from tokenspeed.runtime.distributed.rank_runtime import RankRuntime
from tokenspeed.runtime.engine.process_watchdog import CHILD_STOP_SIGNAL

logger = logging.getLogger(__name__)


def _core(server_args: Any, runtime: RankRuntime, dp_rank: int, device: Any):
    from tokenspeed.runtime.engine.engine_core import EngineCore

    return EngineCore(server_args, dp_rank=dp_rank, device=device, rank_runtime=runtime)


class RankEngine:
    """Rank 0 of a TP group: the EngineCore API, control calls and expert figures."""

    def __init__(self, core: Any, runtime: RankRuntime):
        self.core = core
        self.runtime = runtime

    def __getattr__(self, name: str) -> Any:
        # add_request, abort_request, step, flush_cache, max_total_tokens, ... are the core's
        return getattr(self.core, name)

    def has_unfinished(self) -> bool:
        busy = self.core.has_unfinished()
        if not busy:
            self.runtime.keepalive()
        return busy

    def stats(self) -> Any:
        snap = self.core.stats()
        experts = self.runtime.expert_snapshot()
        if experts is not None and hasattr(snap, "expert_layers"):
            snap.expert_layers = experts.layers
            snap.expert_load = experts.load
            snap.expert_rank_load = experts.rank_load
            snap.eplb_balancedness = experts.balancedness
            snap.eplb_rebalances = experts.rebalances
        return snap

    def shutdown(self) -> None:
        try:
            self.runtime.stop_peers()
        finally:
            self.core.shutdown()
            shutdown_parallel(self.runtime.groups)

    # ---- control calls (RpcRequest "method" -> rpc_<method>) ---------------------------------------
    def rpc_start_expert_distribution_record(self, **_: Any) -> dict:
        self.runtime.recorder_op("start")
        return {"recording": True}

    def rpc_stop_expert_distribution_record(self, **_: Any) -> dict:
        self.runtime.recorder_op("stop")
        recorder = self.runtime.recorder
        return {"recording": recorder.recording, "passes": recorder.state.passes}

    def rpc_dump_expert_distribution_record(self, dir: str | None = None, **_: Any) -> dict:
        """Write the recorded distribution (torch.save) and answer its logical counts."""
        recorder = self.runtime.recorder
        if recorder is None:
            self.runtime.recorder_op("dump")  # raises the "not enabled" error
        folder = Path(dir) if dir else Path(tempfile.gettempdir()) / "tokenspeed-expert-distribution"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"expert_distribution_dp{self.core.dp_rank}_{int(time.time() * 1000)}_{os.getpid()}.pt"
        out = recorder.dump(folder / name)
        snap = self.runtime.expert_snapshot()
        eplb = self.runtime.eplb
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

    def rpc_rebalance_experts(self, **_: Any) -> dict:
        """Rebalance before the next step (or at once when idle)."""
        self.runtime.request_rebalance()
        self.runtime.keepalive(rebalance=True)
        last = self.runtime.eplb.stats.last
        return {
            "rebalances": self.runtime.eplb.stats.rebalances,
            "last": None if last is None else vars(last),
        }


class PeerEngine:
    """A TP peer: the model runner only, driven by rank 0."""

    def __init__(self, core: Any, runtime: RankRuntime):
        self.core = core
        self.runtime = runtime
        self.max_total_tokens = core.max_total_tokens
        self.max_req_input_len = core.max_req_input_len
        self.max_model_len = core.max_model_len

    def follow(self) -> None:
        """Run rank 0's steps; returns on its stop message, raises `LeaderLost` if it vanished first."""
        leader = self.runtime.tp.first_rank
        mapping = self.runtime.groups.mapping
        node = mapping.node_of(leader)
        if node != mapping.node_of(self.runtime.groups.rank):
            # Waiting in rank 0's next broadcast, a peer never gets to run a Python signal handler. On a
            # worker node the stop signal comes from that node's own shutdown (not the head's, which sends
            # the stop message): then it ends the process at once, as there is nothing here to save.
            signal.signal(CHILD_STOP_SIGNAL, signal.SIG_DFL)
        try:
            try:
                self.runtime.follow(self.core.runner)
            except RuntimeError as exc:
                if not _is_connection_loss(exc):
                    raise
                raise LeaderLost(
                    f"lost rank {leader} (node {node}), which leads this rank's tensor-parallel group, "
                    f"before its stop message: it crashed or its node cannot be reached ({exc})"
                ) from exc
            logger.info("rank %d (node %d) sent the stop message: the server is shutting down", leader, node)
        finally:
            self.core.runner.shutdown()
            shutdown_parallel(self.runtime.groups)


class LeaderLost(RuntimeError):
    """A TP peer's rank 0 went away without the stop message it sends when the server stops normally."""


def _is_connection_loss(exc: BaseException) -> bool:
    # gloo reports a vanished peer as a plain RuntimeError ("Connection closed by peer", "Connection reset");
    # newer torch raises DistNetworkError for some of these. A timeout counts too: rank 0 sends at least a
    # keepalive every few seconds while it lives, so silence until the communicator's timeout means it is
    # unreachable (a node that went away without closing its connections).
    dist_error = getattr(torch.distributed, "DistNetworkError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    text = str(exc).lower()
    return any(s in text for s in ("connection closed", "connection reset", "broken pipe", "timed out"))


def _moves_experts(server_args: Any) -> bool:
    return (
        server_args.mapping.moe_ep_size > 1
        or int(server_args.ep_num_redundant_experts or 0) > 0
        or bool(server_args.expert_distribution_recorder_mode)
        or bool(server_args.enable_expert_distribution_metrics)
        or bool(server_args.enable_eplb)
    )


def build_rank_engine(
    server_args: Any, rank: int, dp_rank: int, device: torch.device | str | None, nccl_port: int
) -> RankEngine | PeerEngine:
    from tokenspeed.runtime.engine.engine_core import resolve_device

    dev = resolve_device(server_args, device)
    if dev.type == "cuda" and _moves_experts(server_args) and not server_args.enforce_eager:
        # expert-parallel layers pick their experts on the host each step, and the recorder's on/off
        # state would be frozen into a captured graph: these steps run eagerly
        logger.info("expert parallelism / expert recording: CUDA graphs off (as with --enforce-eager)")
        server_args = copy.copy(server_args)
        server_args.enforce_eager = True
    runtime = RankRuntime.start(server_args, rank, dev, nccl_port)
    core = _core(server_args, runtime, dp_rank, dev)
    logger.info(
        "rank %d: attention TP %d/%d, dense TP %d, MoE EP %d, MoE TP %d",
        rank,
        runtime.tp.rank_in_group,
        runtime.tp.size,
        runtime.groups.dense_tp.size,
        runtime.groups.moe_ep.size,
        runtime.groups.moe_tp.size,
    )
    return RankEngine(core, runtime) if runtime.is_leader else PeerEngine(core, runtime)
