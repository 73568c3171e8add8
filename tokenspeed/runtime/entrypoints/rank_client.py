"""The offline Engine's core when the layout has several ranks (tensor / expert parallel on one node).

`RankClient` starts the same scheduler processes `tokenspeed serve` runs (`ServerProcesses`, one per
rank, over `ServerEndpoints`) and drives them synchronously through the `SchedulerClient` AsyncLLM uses
(its blocking mode): the same sockets, messages, ready handshake and control-call matching.
It answers the EngineCore calls the Engine makes, so tokenizing, detokenizing, stop strings and the
output shapes stay the Engine's one code path whatever the number of ranks:

    add_request / abort_request / has_unfinished / step / stats / flush_cache / shutdown

A rank that dies makes the next call raise `RanksDied` (the other ranks are stopped), never a hang. The
processes are stopped by `shutdown()`, when the client is garbage collected, and at interpreter exit
(before multiprocessing joins its children, which would otherwise wait for ranks that never stop).
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.io_struct import (
    AbortRequest,
    BatchOutput,
    GenerateRequest,
    RequestOutput,
    RpcResponse,
    StatsSnapshot,
)
from tokenspeed.runtime.engine.process_watchdog import RankFailed
from tokenspeed.runtime.engine.prompt_check import check_prompt
from tokenspeed.runtime.engine.scheduler_client import SchedulerClient
from tokenspeed.runtime.entrypoints.launch import ServerProcesses
from tokenspeed.runtime.entrypoints.serve import vocab_size_of
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_RPC_TIMEOUT_S = 60.0
_ABORT_REASONS = ("abort", "stop")


class RanksDied(RuntimeError):
    """A scheduler rank of the Engine exited; the Engine cannot go on and has stopped its other ranks."""


_T = TypeVar("_T")


class _Processes:
    """The ranks, scheduler client and ipc directories of one RankClient; `close()` is idempotent and
    never raises."""

    def __init__(self, server_args: ServerArgs) -> None:
        self.endpoints = ServerEndpoints.from_server_args(server_args)
        self.procs = ServerProcesses(server_args, self.endpoints)
        self.client = SchedulerClient(self.endpoints, self.procs.check_alive)
        self.closed = False
        atexit.register(self.close)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        try:
            self.procs.shutdown()
        except Exception:  # a half-started set of ranks must still be torn down below
            logger.exception("stopping the Engine's ranks failed")
        self.client.close()
        self.endpoints.cleanup()


class RankClient:
    def __init__(self, server_args: ServerArgs) -> None:
        self._world_size = server_args.mapping.world_size
        self._inflight: set[str] = set()
        self._buffer: list[RequestOutput] = []
        self._iteration_tokens: list[int] = []
        self._failure: str | None = None
        self._p = _Processes(server_args)
        # a client dropped without shutdown() still stops its ranks
        self._finalizer = weakref.finalize(self, self._p.close)
        self._finalizer.atexit = False  # _Processes registers its own exit hook, in the right order
        try:
            self._p.procs.start()
            self.limits = self._alive(self._p.client.wait_ready, self._world_size)
            logger.info("%d scheduler ranks ready", self._world_size)
        except BaseException:
            self._p.close()
            raise
        self._vocab_size = vocab_size_of(server_args)

    # ---- the EngineCore calls ------------------------------------------------------------------
    def add_request(self, request: GenerateRequest) -> None:
        """Checks a request as EngineCore does (ValueError before anything is sent), then sends it."""
        self._check_usable()
        SamplingParams.from_dict(request.sampling).verify()
        ids = list(request.input_ids)
        if request.rid in self._inflight:
            raise ValueError(f"request id {request.rid!r} is already running; request ids must be unique")
        check_prompt(ids, self.limits, self._vocab_size)
        self._inflight.add(request.rid)
        self._p.client.send(request)

    def abort_request(self, rid: str, reason: str = "abort") -> bool:
        """Ask rank 0 to finish `rid`; its final output comes from a later step(). False if unknown."""
        if reason not in _ABORT_REASONS:
            raise ValueError(f"abort reason must be one of {_ABORT_REASONS}, got {reason!r}")
        if rid not in self._inflight or self._failure is not None:
            return False
        self._p.client.send(AbortRequest(rid=rid))
        return True

    def has_unfinished(self) -> bool:
        return bool(self._inflight) or bool(self._buffer)

    def step(self) -> list[RequestOutput]:
        """The outputs that arrived since the last call; waits for some while requests are in flight."""
        self._check_usable()
        while not self._buffer and self._inflight:
            self._receive(block=True)
        self._receive(block=False)
        out, self._buffer = self._buffer, []
        return out

    def stats(self) -> StatsSnapshot:
        """Rank 0's snapshot. `iteration_tokens` gathers every step since the last call, except those of
        the last ~0.1 s that rank 0 has not sent yet (they come with the next call)."""
        result = self._rpc("stats").result
        fields = StatsSnapshot.__dataclass_fields__
        snap = StatsSnapshot(**{k: v for k, v in result.items() if k in fields})
        snap.iteration_tokens = self._iteration_tokens + list(snap.iteration_tokens or [])
        self._iteration_tokens = []
        return snap

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are in flight."""
        return bool(self._rpc("flush_cache").ok)

    def shutdown(self) -> None:
        self._inflight.clear()
        self._buffer.clear()
        self._finalizer()

    @property
    def pids(self) -> dict[str, int]:
        return self._p.procs.pids()

    # ---- messages ------------------------------------------------------------------------------
    def _rpc(self, method: str, args: dict | None = None) -> RpcResponse:
        self._check_usable()
        answer = self._alive(self._p.client.call, method, args, _RPC_TIMEOUT_S, self._take)[0]
        if not answer.ok and method != "flush_cache":
            raise RuntimeError(answer.error or f"{method} failed")
        return answer

    def _receive(self, block: bool) -> None:
        """Take in what the ranks sent: one message (waiting for it if `block`), then all already queued."""
        while (msg := self._alive(self._p.client.receive, block)) is not None:
            block = False
            self._take(msg)

    def _take(self, msg: Any) -> None:
        if isinstance(msg, BatchOutput):
            for o in msg.outputs:
                if o.rid not in self._inflight:
                    continue  # a late word on a request given up already
                if o.finished:
                    self._inflight.discard(o.rid)
                self._buffer.append(o)
        elif isinstance(msg, StatsSnapshot):
            # rank 0 hands its step sizes to whoever reads stats first: its pacer or a stats() call
            self._iteration_tokens.extend(msg.iteration_tokens)

    def _alive(self, wait: Callable[..., _T], *args: Any) -> _T:
        """Run one of the client's waits; a rank that died meanwhile fails this Engine (`RanksDied`)."""
        try:
            return wait(*args)
        except RankFailed as exc:
            self._fail(str(exc))
            raise  # not reached: _fail raises

    def _fail(self, reason: str) -> None:
        self._failure = (
            f"a scheduler rank of this Engine died: {reason} (its log above says why); the Engine stopped "
            "its other ranks, create a new Engine to go on"
        )
        self._inflight.clear()
        self._buffer.clear()
        self._finalizer()
        raise RanksDied(self._failure)

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RanksDied(self._failure)
        if not self._finalizer.alive:
            raise RuntimeError("this Engine was shut down; create a new one")
