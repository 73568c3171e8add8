"""What one rank shares with the other ranks of its server: its shard of the model, the KV pool size, and
each step's batch decision.

`GroupPeers` joins the server's torch.distributed world: the model is this rank's shard, the KV cache
sees this rank's heads, the pool is the smallest of the TP group (so slots chosen by rank 0 exist on
every peer), and rank 0 broadcasts each step's decision and the pending expert operations before its
forward. Peers of a TP group (`follow`) run no scheduler: they apply each decision and run the same
forward. While rank 0 is idle it sends an empty decision every `KEEPALIVE_S` seconds, so a peer waiting
for work never reaches the communicator's timeout.

`NoPeers` is the single-rank null object: the whole model, the pool as measured, nothing to send.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import torch
from torch import nn

from tokenspeed.config.ports import split_host_port
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.slices import ExpertPlan
from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable
from tokenspeed.runtime.distributed.batch_sync import PageMirror, decode_batch, encode_batch
from tokenspeed.runtime.distributed.comm import broadcast_object, min_over_group
from tokenspeed.runtime.distributed.groups import ParallelGroups, init_parallel, shutdown_parallel
from tokenspeed.runtime.distributed.tensor_parallel import load_parallel_model, local_kv_heads
from tokenspeed.runtime.execution.forward_batch import ForwardBatch
from tokenspeed.runtime.models.loader import load_model
from tokenspeed.runtime.moe.expert_parallel import ExpertParallelState
from tokenspeed.runtime.moe.rank_experts import ExpertController
from tokenspeed.runtime.scheduler.batch import ScheduledBatch

KEEPALIVE_S = 5.0


@dataclasses.dataclass
class LoadedModel:
    model: nn.Module
    expert_state: ExpertParallelState | None  # set under expert parallelism (or redundant experts)


class PeerSync(Protocol):
    """What the engine and the model runner ask of the ranks beside this one."""

    is_leader: bool
    # No other rank runs this server's steps: a single-GPU server that only records or rebalances its experts
    # has a GroupPeers too, and may schedule ahead (overlap), since every expert operation it applies between
    # steps is ordered on its one device after the batch in flight.
    alone: bool

    def load_model(self, model_config: Any, load_format: str, device: torch.device, seed: int) -> LoadedModel: ...
    def local_model_config(self, model_config: Any) -> Any: ...
    def agree_num_pages(self, num_pages: int) -> int: ...
    def before_forward(self, batch: ScheduledBatch) -> None: ...
    def keepalive(self, rebalance: bool = False) -> None: ...
    def close(self) -> None: ...


class StepRunner(Protocol):
    """What a peer's ``follow`` drives: the model runner (execution/model_runner.py), which sits above this
    module since it asks its peers for the model and the pool size."""

    req_to_token: ReqToTokenTable

    def prepare(self, batch: ScheduledBatch) -> ForwardBatch: ...
    def run(self, fb: ForwardBatch) -> torch.Tensor: ...


class NoPeers:
    """A rank alone in its server."""

    is_leader = True
    alone = True

    def load_model(self, model_config: Any, load_format: str, device: torch.device, seed: int) -> LoadedModel:
        return LoadedModel(load_model(model_config, load_format, device, seed), None)

    def local_model_config(self, model_config: Any) -> Any:
        return model_config

    def agree_num_pages(self, num_pages: int) -> int:
        return num_pages

    def before_forward(self, batch: ScheduledBatch) -> None:
        return None

    def keepalive(self, rebalance: bool = False) -> None:
        return None

    def close(self) -> None:
        return None


def dist_init_method(server_args: ServerArgs, nccl_port: int) -> str:
    """Where the ranks of a server meet: `--dist-init-addr` across nodes, else a port of this node."""
    addr = server_args.dist_init_addr
    if addr:
        host, port = split_host_port(addr)
        host = f"[{host}]" if ":" in host else host
        return f"tcp://{host}:{port}"
    return f"tcp://127.0.0.1:{nccl_port}"


def join_server_world(server_args: ServerArgs, rank: int, device: torch.device, nccl_port: int) -> ParallelGroups:
    """Join the server's torch.distributed world (when this rank has peers) and build its groups."""
    init_method = dist_init_method(server_args, nccl_port)
    return init_parallel(server_args.mapping, rank, init_method, device, server_args.distributed_timeout_seconds)


class GroupPeers:
    """A rank of a server with several ranks (or with experts to place): its groups and its TP peers."""

    def __init__(self, groups: ParallelGroups, plan: ExpertPlan, experts: ExpertController, block_size: int,
                 timeout_s: float | None = None):  # fmt: skip
        self.groups = groups
        self.plan = plan
        self.experts = experts
        self.mirror = PageMirror(block_size)
        self._last_sent = time.monotonic()
        # well inside the communicator's timeout, however short the user set it
        self.keepalive_s = min(KEEPALIVE_S, timeout_s / 3) if timeout_s else KEEPALIVE_S

    @property
    def tp(self):
        return self.groups.attn_tp

    @property
    def is_leader(self) -> bool:
        return self.tp.is_first

    @property
    def alone(self) -> bool:
        return self.groups.world.size == 1

    # ---- model runner hooks -------------------------------------------------------------------
    def load_model(self, model_config: Any, load_format: str, device: torch.device, seed: int) -> LoadedModel:
        pm = load_parallel_model(model_config, self.groups, load_format, device, seed, self.plan)
        return LoadedModel(pm.model, pm.expert_state)

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

    def before_forward(self, batch: ScheduledBatch) -> None:
        """Rank 0: send the step to the peers, then apply the control operations everyone applies."""
        ops = self.experts.take_ops()
        if self.tp.size > 1:
            broadcast_object({"ops": ops, "batch": encode_batch(batch, self.mirror)}, self.tp)
            self._last_sent = time.monotonic()
        self.experts.apply_ops(ops)

    # ---- rank 0 between steps ------------------------------------------------------------------
    def keepalive(self, rebalance: bool = False) -> None:
        """Rank 0, idle: flush pending control operations, and keep waiting peers from timing out.

        A rebalance that falls due by step count waits for the next step (the load it would serve);
        `rebalance=True` (an explicit request) runs it now.
        """
        experts = self.experts
        if self.tp.size == 1 or not self.is_leader:
            if experts.has_pending() or rebalance:
                experts.apply_ops(experts.take_ops(rebalance))
            return
        if experts.has_pending() or rebalance or time.monotonic() - self._last_sent > self.keepalive_s:
            ops = experts.take_ops(rebalance)
            broadcast_object({"ops": ops}, self.tp)
            self._last_sent = time.monotonic()
            experts.apply_ops(ops)

    def close(self) -> None:
        """Rank 0 tells its peers to stop; every rank leaves the torch.distributed world."""
        try:
            if self.tp.size > 1 and self.is_leader:
                broadcast_object({"stop": True}, self.tp)
        finally:
            shutdown_parallel(self.groups)

    # ---- peers ----------------------------------------------------------------------------------
    def follow(self, runner: StepRunner) -> None:
        """A peer's whole life: apply rank 0's decisions until it says stop."""
        while True:
            msg = broadcast_object(None, self.tp)
            if msg.get("stop"):
                return
            self.experts.apply_ops(msg.get("ops") or [], from_leader=True)
            data = msg.get("batch")
            if data:
                runner.run(runner.prepare(decode_batch(data, runner.req_to_token)))
