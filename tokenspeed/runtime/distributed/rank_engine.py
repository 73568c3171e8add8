"""The engine of one scheduler rank when it has peers or experts to manage.

`build_rank_engine` is what a scheduler process calls then: it joins the server's torch.distributed world
(`GroupPeers`), sets up the rank's experts (`RankExperts`), builds the EngineCore around a runner that
shards the model for this rank, and returns

- on rank 0 of a TP group: that `EngineCore`, which the process's event loop drives as usual;
- on a peer: a `PeerEngine`, whose `follow()` runs rank 0's decisions until told to stop.
"""

from __future__ import annotations

import logging
import signal

import torch

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.slices import ExpertPlan
from tokenspeed.runtime.distributed.peer_sync import GroupPeers, join_server_world
from tokenspeed.runtime.engine.engine_core import EngineCore, resolve_device
from tokenspeed.runtime.engine.process_watchdog import CHILD_STOP_SIGNAL
from tokenspeed.runtime.moe.rank_experts import RankExperts
from tokenspeed.runtime.startup_phases import StartupPhases

logger = logging.getLogger(__name__)


def needs_group_peers(server_args: ServerArgs) -> bool:
    """Whether a server needs more than the plain single-rank engine."""
    mapping = server_args.mapping
    return mapping.attn_tp_size * mapping.attn_cp_size > 1 or ExpertPlan.from_server_args(server_args).moves_experts


class PeerEngine:
    """A TP peer: the model runner only, driven by rank 0."""

    def __init__(self, core: EngineCore, peers: GroupPeers):
        self.core = core
        self.peers = peers
        self.max_total_tokens = core.max_total_tokens
        self.max_req_input_len = core.max_req_input_len
        self.max_model_len = core.max_model_len
        self.startup_seconds = core.startup_seconds

    def follow(self) -> None:
        """Run rank 0's steps; returns on its stop message, raises `LeaderLost` if it vanished first."""
        leader = self.peers.tp.first_rank
        mapping = self.peers.groups.mapping
        node = mapping.node_of(leader)
        if node != mapping.node_of(self.peers.groups.rank):
            # Waiting in rank 0's next broadcast, a peer never gets to run a Python signal handler. On a
            # worker node the stop signal comes from that node's own shutdown (not the head's, which sends
            # the stop message): then it ends the process at once, as there is nothing here to save.
            signal.signal(CHILD_STOP_SIGNAL, signal.SIG_DFL)
        try:
            try:
                self.peers.follow(self.core.runner)
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
            self.peers.close()


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


def build_rank_engine(
    server_args: ServerArgs, rank: int, dp_rank: int, device: torch.device | str | None, nccl_port: int
) -> EngineCore | PeerEngine:
    dev = resolve_device(server_args, device)
    plan = ExpertPlan.from_server_args(server_args)
    startup = StartupPhases()
    with startup.phase("process group init"):  # waits for every rank of the world to join, too
        groups = join_server_world(server_args, rank, dev, nccl_port)
        experts = RankExperts(plan, groups.attn_tp.is_first, server_args.mapping.nnodes)
        timeout = server_args.distributed_timeout_seconds
        peers = GroupPeers(groups, plan, experts, server_args.block_size, timeout)
    core = EngineCore(server_args, dp_rank=dp_rank, device=dev, peers=peers, experts=experts, startup=startup)
    logger.info(
        "rank %d: attention TP %d/%d, dense TP %d, MoE EP %d, MoE TP %d",
        rank,
        peers.tp.rank_in_group,
        peers.tp.size,
        peers.groups.dense_tp.size,
        peers.groups.moe_ep.size,
        peers.groups.moe_tp.size,
    )
    return core if peers.is_leader else PeerEngine(core, peers)
