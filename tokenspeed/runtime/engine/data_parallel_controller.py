"""The data-parallel controller process: spreads requests over the DP groups by `--load-balance-method`.

- round_robin: groups in turn.
- shortest_queue: the group with the fewest running + waiting requests.
- minimum_cache_usage: the group with the lowest KV-cache usage.

Loads come from the schedulers' stats snapshots (pushed every `--load-watch-interval` seconds). Between two
snapshots the controller counts what it dispatched itself, so a burst of requests arriving within one
interval is spread instead of piling onto the group that looked idlest a moment ago. Aborts, cache flushes
and control calls go to every group.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import dataclass, field

import zmq

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.io_struct import GenerateRequest, StatsSnapshot, decode
from tokenspeed.runtime.engine.process_watchdog import StopFlag, die_with_parent, parent_alive
from tokenspeed.runtime.engine.rank_info import configure_child_logging

logger = logging.getLogger("tokenspeed.dp_controller")

LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue", "minimum_cache_usage")


@dataclass
class GroupLoad:
    """A DP group's last stats snapshot, and what the controller sent it since (not in that snapshot yet)."""

    snapshot: StatsSnapshot = field(default_factory=StatsSnapshot)
    dispatched_since_snapshot: int = 0
    # Prompt tokens dispatched since the last snapshot: the KV pages they will take are not counted yet.
    pending_tokens: int = 0


@dataclass
class LoadBalancer:
    method: str
    dp_size: int
    loads: list[GroupLoad] = field(default_factory=list)
    next_group: int = 0

    def __post_init__(self) -> None:
        if self.method not in LOAD_BALANCE_METHODS:
            raise ValueError(
                f"--load-balance-method {self.method} is not available; choose one of {list(LOAD_BALANCE_METHODS)}"
            )
        if not self.loads:
            self.loads = [GroupLoad() for _ in range(self.dp_size)]

    def observe(self, snap: StatsSnapshot) -> None:
        if not 0 <= snap.dp_rank < self.dp_size:
            return
        self.loads[snap.dp_rank] = GroupLoad(snap)

    def pick(self, num_tokens: int) -> int:
        if self.method == "round_robin":
            group = self.next_group
            self.next_group = (self.next_group + 1) % self.dp_size
        elif self.method == "shortest_queue":
            group = min(range(self.dp_size), key=lambda g: (self._queue(g), g))
        else:
            group = min(range(self.dp_size), key=lambda g: (self._cache_usage(g), self._queue(g), g))
        load = self.loads[group]
        load.dispatched_since_snapshot += 1
        load.pending_tokens += num_tokens
        return group

    def _queue(self, g: int) -> int:
        load = self.loads[g]
        return load.snapshot.num_running + load.snapshot.num_waiting + load.dispatched_since_snapshot

    def _cache_usage(self, g: int) -> float:
        load = self.loads[g]
        capacity = load.snapshot.kv_pages_total * load.snapshot.block_size
        pending = load.pending_tokens / capacity if capacity else 0.0
        return load.snapshot.kv_usage + pending


def run_data_parallel_controller(server_args: ServerArgs, endpoints: ServerEndpoints, parent_pid: int) -> None:
    """Entry point of the spawned controller process."""
    die_with_parent(parent_pid)
    stop = StopFlag().install()
    configure_child_logging(server_args, "dp-controller")
    try:
        code = _serve(server_args, endpoints, parent_pid, stop)
    except Exception:
        logger.error("data-parallel controller failed:\n%s", traceback.format_exc())
        code = 1
    sys.stderr.flush()
    os._exit(code)


def _serve(server_args: ServerArgs, endpoints: ServerEndpoints, parent_pid: int, stop: StopFlag) -> int:
    balancer = LoadBalancer(method=server_args.load_balance_method, dp_size=endpoints.dp_size)
    ctx = zmq.Context(io_threads=1)
    inp = ctx.socket(zmq.PULL)
    inp.setsockopt(zmq.RCVHWM, 0)
    inp.bind(endpoints.request_input)
    load = ctx.socket(zmq.PULL)
    load.setsockopt(zmq.RCVHWM, 0)
    load.bind(endpoints.load)
    ranks = []
    for addr in endpoints.rank_inputs:
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(addr)
        ranks.append(s)
    poller = zmq.Poller()
    poller.register(inp, zmq.POLLIN)
    poller.register(load, zmq.POLLIN)
    logger.info("balancing %d groups by %s", endpoints.dp_size, balancer.method)
    try:
        while not stop.is_set():
            if not parent_alive(parent_pid):
                logger.error("parent process %d is gone; exiting", parent_pid)
                return 1
            events = dict(poller.poll(100))
            # Loads first, so a request arriving in the same poll sees the freshest numbers.
            if load in events:
                _drain(load, lambda raw: _observe(balancer, raw))
            if inp in events:
                _drain(inp, lambda raw: _route(balancer, ranks, raw))
    finally:
        for s in (inp, load, *ranks):
            s.close(linger=0)
        ctx.term()
    return 0


def _drain(sock: zmq.Socket, handle) -> None:
    while True:
        try:
            raw = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        handle(raw)


def _observe(balancer: LoadBalancer, raw: bytes) -> None:
    msg = decode(raw)
    if isinstance(msg, StatsSnapshot):
        balancer.observe(msg)


def _route(balancer: LoadBalancer, ranks: list[zmq.Socket], raw: bytes) -> None:
    # Decoding only to read the kind and size; the bytes are forwarded unchanged.
    try:
        msg = decode(raw)
    except Exception as exc:
        logger.error("dropping undecodable message: %s", exc)
        return
    if isinstance(msg, GenerateRequest):
        ranks[balancer.pick(len(msg.input_ids))].send(raw)
    else:
        for s in ranks:
            s.send(raw)
