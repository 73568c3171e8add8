"""The main process's link to its scheduler ranks, shared by the HTTP server (`AsyncLLM`) and the offline
multi-rank Engine (`RankClient`), so both speak to the ranks through one implementation of the protocol.

One PUSH socket sends requests, aborts and control calls to `request_input` (the only scheduler, or the
DP controller); one PULL socket, bound at `output`, takes what every rank sends back: token outputs, stats
snapshots, ready messages, control-call answers. The addresses are `ServerEndpoints`' (from `PortArgs`);
the messages are msgpack (`io_struct.encode` / `decode`, never pickle). Besides the sockets it owns:

- the ready handshake: one `ReadyMessage` per rank, turned into the `ModelLimits` prompts are checked
  against (`prompt_check.limits_from_ready`);
- control calls: an `RpcRequest` reaches every DP group, and its answers (one per group) are matched to
  the call by id; answers are never handed to the caller's message loop;
- rank death: while it waits (for the handshake, or in the blocking mode for any message) it calls
  `check_alive` every 200 ms, whose exception (the launcher's `ChildDied`, a `RankFailed`) reaches the
  caller; a rank whose engine cannot be built sends `StartupFailed` instead of its ready message, which
  raises `RankFailed` with its reason.

Two modes, one protocol: blocking (the offline Engine's synchronous calls) and asyncio (`AsyncLLM`, on
the HTTP server's event loop), chosen at construction.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.io_struct import (
    ReadyMessage,
    RpcRequest,
    RpcResponse,
    StartupFailed,
    decode,
    encode,
)
from tokenspeed.runtime.engine.process_watchdog import RankFailed
from tokenspeed.runtime.engine.prompt_check import limits_from_ready
from tokenspeed.runtime.engine.request_state import ModelLimits
from tokenspeed.runtime.startup_phases import format_phases

logger = logging.getLogger("tokenspeed.scheduler_client")

_POLL_MS = 200
# Ranks on other nodes only show up in the handshake: say what is missing rather than wait in silence.
_READY_NOTE_INTERVAL_S = 30.0


@dataclass
class _Call:
    answers: list[RpcResponse] = field(default_factory=list)
    future: asyncio.Future | None = None  # asyncio mode: resolved when every DP group has answered


class SchedulerClient:
    def __init__(
        self, endpoints: ServerEndpoints, check_alive: Callable[[], None], *, asynchronous: bool = False
    ) -> None:
        self.output_addr = endpoints.output
        self.dp_size = endpoints.dp_size  # a control call has one answer per DP group
        self._check_alive = check_alive
        self._ctx: zmq.Context = (
            zmq.asyncio.Context(io_threads=1) if asynchronous else zmq.Context(io_threads=1)
        )
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(endpoints.output)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(endpoints.request_input)
        self._calls: dict[str, _Call] = {}
        self.closed = False

    def send(self, msg: Any) -> None:
        # No high-water mark: the send completes here in both modes, never waits for the ranks.
        self._push.send(encode(msg))

    def close(self) -> None:
        """Idempotent; pending calls are left to their callers' timeouts."""
        if self.closed:
            return
        self.closed = True
        self._pull.close(linger=0)
        self._push.close(linger=0)
        self._ctx.term()

    # ------------------------------------------------------------------ ready handshake

    def wait_ready(self, expected: int) -> ModelLimits:
        """Blocking mode: one ReadyMessage from each of `expected` ranks (other messages are dropped). The
        offline Engine's ranks are all on this node, so a slow start needs no note about other nodes."""
        waiting = _ReadyWait(expected, self.output_addr, note_every_s=None)
        while not waiting.done:
            waiting.note_if_slow()
            self._check_alive()
            if self._pull.poll(_POLL_MS):
                waiting.take(decode(self._pull.recv()))
        return waiting.limits()

    async def await_ready(self, expected: int) -> ModelLimits:
        """Asyncio mode: as `wait_ready`, without blocking the event loop; a note every 30 s names the
        ranks still missing (those of other nodes only show up here)."""
        waiting = _ReadyWait(expected, self.output_addr, note_every_s=_READY_NOTE_INTERVAL_S)
        while not waiting.done:
            waiting.note_if_slow()
            self._check_alive()
            if await self._pull.poll(_POLL_MS):
                waiting.take(decode(await self._pull.recv()))
        return waiting.limits()

    # ------------------------------------------------------------------ receiving

    def receive(self, block: bool) -> Any | None:
        """Blocking mode: the next message that is not a control-call answer (those go to their call);
        with `block`, waits for one, checking the ranks are alive; without, None when nothing is queued."""
        while True:
            if block:
                while not self._pull.poll(_POLL_MS):
                    self._check_alive()
                raw = self._pull.recv()
            else:
                try:
                    raw = self._pull.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return None
            msg = decode(raw)
            if not self._matched(msg):
                return msg

    async def areceive(self) -> Any:
        """Asyncio mode: the next message that is not a control-call answer (those resolve their call)."""
        while True:
            raw = await self._pull.recv()
            try:
                msg = decode(raw)
            except Exception:  # one bad message must not stop the server's only receive loop
                logger.exception("dropped a scheduler message that does not decode")
                continue
            if not self._matched(msg):
                return msg

    # ------------------------------------------------------------------ control calls

    def call(
        self, method: str, args: dict | None, timeout: float, on_message: Callable[[Any], None]
    ) -> list[RpcResponse]:
        """Blocking mode: send a control call to every DP group and wait for their answers; the messages
        that arrive meanwhile go to `on_message`. TimeoutError after `timeout` seconds."""
        call_id = self._start(method, args, None)
        deadline = time.monotonic() + timeout
        try:
            while len(self._calls[call_id].answers) < self.dp_size:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no answer to {method!r} from the scheduler ranks within {timeout:.0f} s"
                    )
                if self._pull.poll(_POLL_MS):
                    msg = decode(self._pull.recv())
                    if not self._matched(msg):
                        on_message(msg)
                else:
                    self._check_alive()
            return self._calls[call_id].answers
        finally:
            self._calls.pop(call_id, None)

    async def acall(self, method: str, args: dict | None = None, timeout: float = 30.0) -> list[RpcResponse]:
        """Asyncio mode: the same call; answers are matched by whoever runs `areceive()`."""
        future = asyncio.get_running_loop().create_future()
        call_id = self._start(method, args, future)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._calls.pop(call_id, None)

    def _start(self, method: str, args: dict | None, future: asyncio.Future | None) -> str:
        call_id = uuid.uuid4().hex
        self._calls[call_id] = _Call(future=future)
        self.send(RpcRequest(method=method, args=args or {}, call_id=call_id))
        return call_id

    def _matched(self, msg: Any) -> bool:
        """True if `msg` is a control-call answer (recorded for its call, or dropped when too late)."""
        if not isinstance(msg, RpcResponse):
            return False
        call = self._calls.get(msg.call_id)
        if call is None:
            return True  # its caller gave up (timeout) already
        call.answers.append(msg)
        if call.future is not None and len(call.answers) >= self.dp_size and not call.future.done():
            call.future.set_result(call.answers)
        return True


class _ReadyWait:
    """The handshake's state: the ranks ready so far, and (with `note_every_s`) a note while some miss."""

    def __init__(self, expected: int, output_addr: str, note_every_s: float | None) -> None:
        self.expected = expected
        self.output_addr = output_addr
        self.note_every_s = note_every_s
        self.ready: list[ReadyMessage] = []
        self.started = self.last_note = time.monotonic()

    @property
    def done(self) -> bool:
        return len(self.ready) >= self.expected

    def take(self, msg: Any) -> None:
        if isinstance(msg, StartupFailed):
            raise RankFailed(f"scheduler dp{msg.dp_rank} tp{msg.tp_rank} could not start: {msg.error}")
        if isinstance(msg, ReadyMessage):
            self.ready.append(msg)
            phases = format_phases(msg.startup)
            logger.info(
                "scheduler dp%d tp%d ready (%d/%d)%s", msg.dp_rank, msg.tp_rank, len(self.ready), self.expected,
                f" after {sum(msg.startup.values()):.1f} s: {phases}" if phases else "",
            )  # fmt: skip

    def note_if_slow(self) -> None:
        now = time.monotonic()
        if self.note_every_s is None or now - self.last_note < self.note_every_s:
            return
        self.last_note = now
        logger.warning(
            "still waiting for %d of %d scheduler rank(s) after %.0f s (ready: %s); ranks on other nodes "
            "must reach %s",
            self.expected - len(self.ready), self.expected, now - self.started,
            ", ".join(f"dp{m.dp_rank} tp{m.tp_rank}" for m in self.ready) or "none", self.output_addr,
        )  # fmt: skip

    def limits(self) -> ModelLimits:
        return limits_from_ready(self.ready)
