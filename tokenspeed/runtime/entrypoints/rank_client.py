"""The offline Engine's core when the layout has several ranks (tensor / expert parallel on one node).

`RankClient` starts the same scheduler processes `tokenspeed serve` runs (`ServerProcesses`, one per
rank, over `ServerEndpoints`) and drives them synchronously with the msgpack messages AsyncLLM sends
(`GenerateRequest`, `AbortRequest`, `RpcRequest` out; `BatchOutput`, `RpcResponse`, `ReadyMessage` in).
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
import time
import uuid
import weakref
from typing import Any

import zmq

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.io_struct import (
    AbortRequest,
    BatchOutput,
    GenerateRequest,
    ReadyMessage,
    RequestOutput,
    RpcRequest,
    RpcResponse,
    StatsSnapshot,
    decode,
    encode,
)
from tokenspeed.runtime.engine.prompt_check import check_prompt, limits_from_ready
from tokenspeed.runtime.engine.request_state import ModelLimits
from tokenspeed.runtime.entrypoints.serve import vocab_size_of
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_POLL_MS = 200
_RPC_TIMEOUT_S = 60.0
_ABORT_REASONS = ("abort", "stop")


class RanksDied(RuntimeError):
    """A scheduler rank of the Engine exited; the Engine cannot go on and has stopped its other ranks."""


class _Processes:
    """The ranks, sockets and ipc directories of one client; `close()` is idempotent and never raises."""

    def __init__(self, server_args: ServerArgs) -> None:
        from tokenspeed.runtime.entrypoints.launch import ServerProcesses

        self.endpoints = ServerEndpoints.from_server_args(server_args)
        self.procs = ServerProcesses(server_args, self.endpoints)
        self.ctx = zmq.Context(io_threads=1)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.pull.bind(self.endpoints.output)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 0)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(self.endpoints.request_input)
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
        for sock in (self.pull, self.push):
            sock.close(linger=0)
        self.ctx.term()
        self.endpoints.cleanup()


class RankClient:
    def __init__(self, server_args: ServerArgs) -> None:
        self._world_size = server_args.mapping.world_size
        self._inflight: set[str] = set()
        self._buffer: list[RequestOutput] = []
        self._rpc_answers: dict[str, RpcResponse] = {}
        self._iteration_tokens: list[int] = []
        self._failure: str | None = None
        self._p = _Processes(server_args)
        # a client dropped without shutdown() still stops its ranks
        self._finalizer = weakref.finalize(self, self._p.close)
        self._finalizer.atexit = False  # _Processes registers its own exit hook, in the right order
        try:
            self._p.procs.start()
            self.limits = self._wait_ready()
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
        self._p.push.send(encode(request))

    def abort_request(self, rid: str, reason: str = "abort") -> bool:
        """Ask rank 0 to finish `rid`; its final output comes from a later step(). False if unknown."""
        if reason not in _ABORT_REASONS:
            raise ValueError(f"abort reason must be one of {_ABORT_REASONS}, got {reason!r}")
        if rid not in self._inflight or self._failure is not None:
            return False
        self._p.push.send(encode(AbortRequest(rid=rid)))
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
    def _wait_ready(self) -> ModelLimits:
        ready: list[ReadyMessage] = []
        while len(ready) < self._world_size:
            msg = self._next_message()
            if isinstance(msg, ReadyMessage):
                ready.append(msg)
        logger.info("%d scheduler ranks ready", len(ready))
        return limits_from_ready(ready)

    def _rpc(self, method: str, args: dict | None = None) -> RpcResponse:
        self._check_usable()
        call_id = uuid.uuid4().hex
        self._p.push.send(encode(RpcRequest(method=method, args=args or {}, call_id=call_id)))
        deadline = time.monotonic() + _RPC_TIMEOUT_S
        while call_id not in self._rpc_answers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to {method!r} from rank 0 within {_RPC_TIMEOUT_S:.0f} s")
            self._receive(block=True)
        answer = self._rpc_answers.pop(call_id)
        if not answer.ok and method != "flush_cache":
            raise RuntimeError(answer.error or f"{method} failed")
        return answer

    def _receive(self, block: bool) -> None:
        """Take in what the ranks sent: one message (waiting for it if `block`), then all already queued."""
        while True:
            msg = self._next_message() if block else self._poll_message()
            if msg is None:
                return
            block = False
            if isinstance(msg, BatchOutput):
                for o in msg.outputs:
                    if o.rid not in self._inflight:
                        continue  # a late word on a request given up already
                    if o.finished:
                        self._inflight.discard(o.rid)
                    self._buffer.append(o)
            elif isinstance(msg, RpcResponse):
                self._rpc_answers[msg.call_id] = msg
            elif isinstance(msg, StatsSnapshot):
                # rank 0 hands its step sizes to whoever reads stats first: its pacer or a stats() call
                self._iteration_tokens.extend(msg.iteration_tokens)

    def _poll_message(self) -> Any:
        try:
            return decode(self._p.pull.recv(zmq.NOBLOCK))
        except zmq.Again:
            return None

    def _next_message(self) -> Any:
        """The next message from any rank; raises `RanksDied` if a rank exits while waiting."""
        from tokenspeed.runtime.entrypoints.launch import ChildDied

        while not self._p.pull.poll(_POLL_MS):
            try:
                self._p.procs.check_alive()
            except ChildDied as exc:
                self._fail(str(exc))
        return decode(self._p.pull.recv())

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
