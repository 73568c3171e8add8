"""Spawning a server's child processes: one scheduler per rank on this node, the DP controller on node 0.

Processes start with the multiprocessing "spawn" context (a fresh interpreter: no forked CUDA or thread
state). Ranks come from `Mapping`: each rank's data-parallel group and tensor-parallel rank decide which
sockets it binds, so more ranks (tensor parallel, more nodes) need no change here.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.process_watchdog import (
    ChildProcess,
    RankFailed,
    die_with_parent,
    terminate_children,
)
from tokenspeed.runtime.engine.rank_info import RankInfo

logger = logging.getLogger("tokenspeed.launch")


class ServerProcesses:
    def __init__(self, server_args: ServerArgs, endpoints: ServerEndpoints) -> None:
        self.server_args = server_args
        self.endpoints = endpoints
        self.children: list[ChildProcess] = []

    @property
    def node_rank(self) -> int:
        return self.server_args.node_rank

    def rank_infos(self) -> list[RankInfo]:
        mapping = self.server_args.mapping
        local = mapping.ranks_on_node(self.node_rank)
        infos = []
        for rank in local:
            p = mapping.placement(rank)
            infos.append(
                RankInfo(
                    rank=rank,
                    dp_rank=p.attn_dp_rank,
                    tp_rank=p.attn_tp_rank + p.attn_cp_rank * mapping.attn_tp_size,
                    gpu_id=p.gpu_id,
                    num_local_ranks=len(local),
                )
            )
        return infos

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent = os.getpid()
        if self.endpoints.dp_size > 1 and self.node_rank == 0:
            proc = ctx.Process(
                target=_data_parallel_controller_main,
                args=(self.server_args, self.endpoints, parent),
                name="tokenspeed-dp-controller",
                daemon=False,
            )
            proc.start()
            self.children.append(ChildProcess("data-parallel controller", proc))
        for info in self.rank_infos():
            proc = ctx.Process(
                target=_scheduler_main,
                args=(self.server_args, self.endpoints, info, parent),
                name=f"tokenspeed-scheduler-dp{info.dp_rank}-tp{info.tp_rank}",
                daemon=False,
            )
            proc.start()
            self.children.append(ChildProcess(f"scheduler dp{info.dp_rank} tp{info.tp_rank}", proc))
        logger.info("started %d child process(es): %s", len(self.children), self.pids())

    def pids(self) -> dict[str, int]:
        return {c.name: c.process.pid for c in self.children if c.process.pid is not None}

    def check_alive(self) -> None:
        for c in self.children:
            if not c.process.is_alive():
                raise ChildDied(f"{c.name} (pid {c.process.pid}) exited with code {c.process.exitcode}")

    def shutdown(self, timeout: float = 10.0) -> None:
        terminate_children(self.children, timeout)


class ChildDied(RankFailed):
    """A child process exited (its exit code in the message)."""


# The children's entry points import their process's code in the child: the front end spawns its children
# before it imports torch (seconds), so their start-up runs alongside the front end's own. A front end that
# fails meanwhile takes them with it, imports and all.


def _scheduler_main(server_args: ServerArgs, endpoints: ServerEndpoints, info: RankInfo, parent: int) -> None:
    die_with_parent(parent)
    from tokenspeed.runtime.engine.event_loop import run_scheduler_process

    run_scheduler_process(server_args, endpoints, info, parent)


def _data_parallel_controller_main(server_args: ServerArgs, endpoints: ServerEndpoints, parent: int) -> None:
    die_with_parent(parent)
    from tokenspeed.runtime.engine.data_parallel_controller import run_data_parallel_controller

    run_data_parallel_controller(server_args, endpoints, parent)
