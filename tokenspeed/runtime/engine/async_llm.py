"""AsyncLLM: the main process's side of the engine: send tokenized requests, track them, detokenize.

Runs on the HTTP server's event loop. The ranks are reached through a `SchedulerClient` (asyncio mode):
requests go out to the only scheduler or to the DP controller; every scheduler answers with token
outputs, stats snapshots, ready messages and control-call answers. Each request's `generate()` iterator is woken only when there is something
worth sending (every `--stream-interval` tokens when streaming, at the end otherwise); if its consumer goes
away before the end (a client disconnect cancels it), the request is aborted so its KV pages are freed.

A request ends in one of three ways: its own stop conditions (stop, length), its client's abort, or a
`RequestFailure` (the server shutting down, a scheduler dying, an internal error), which its client is
told as an error: a truncated answer never looks complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.detokenizer import IncrementalDetokenizer
from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.io_struct import (
    AbortRequest,
    BatchOutput,
    GenerateRequest,
    RequestOutput,
    RpcResponse,
    StatsSnapshot,
)
from tokenspeed.runtime.engine.prompt_check import (
    check_fits,
    check_not_empty,
    check_token_ids,
    room_for,
)
from tokenspeed.runtime.engine.prompt_encoder import PromptEncoder
from tokenspeed.runtime.engine.request_log import RequestLogger
from tokenspeed.runtime.engine.request_state import (
    ModelLimits,
    RequestFailure,
    SequenceOutput,
    TrackedRequest,
)
from tokenspeed.runtime.engine.scheduler_client import SchedulerClient
from tokenspeed.runtime.engine.scheduler_liveness import CHECK_S, SchedulerLiveness, scheduler_timeout
from tokenspeed.runtime.metrics.collector import FinishedRequestStats, ServerMetrics
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger("tokenspeed.async_llm")


class ServerUnavailable(RuntimeError):
    """The server is starting or draining: the HTTP layer answers 503."""


class AsyncLLM:
    def __init__(
        self,
        server_args: ServerArgs,
        tokenizer: Any,
        metrics: ServerMetrics | None,
        *,
        endpoints: ServerEndpoints,
        check_alive: Callable[[], None],
        vocab_size: int | None = None,
    ) -> None:
        """`check_alive` raises when a scheduler process died (the launcher's `check_alive`): the ready
        handshake stops with it instead of waiting for a rank that will never answer."""
        self.server_args = server_args
        self.tokenizer = tokenizer
        self.prompts = PromptEncoder(tokenizer)
        self.metrics = metrics
        self.dp_size = endpoints.dp_size
        self.vocab_size = vocab_size
        self.stream_interval = max(1, server_args.stream_interval)
        self.limits: ModelLimits | None = None
        self.rank_stats: dict[int, StatsSnapshot] = {}
        self.accepting = False
        self._requests: dict[str, TrackedRequest] = {}
        self.inflight_tokens = 0  # prompt tokens of the requests in flight (the HTTP admission limit)
        self._log = RequestLogger.from_server_args(server_args, tokenizer)
        self._client = SchedulerClient(endpoints, check_alive, asynchronous=True)
        self._recv_task: asyncio.Task | None = None
        # Which ranks are heard from: a silent one stalls the server (scheduler_liveness.py).
        self.liveness = SchedulerLiveness(scheduler_timeout())
        self._watch_task: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ life cycle

    async def wait_ready(self, expected: int) -> ModelLimits:
        """Wait for one ready message per scheduler rank; raises `RankFailed` if a rank says it cannot
        start or its process dies meanwhile."""
        self.limits = await self._client.await_ready(expected)
        self.prompts.max_model_len = self.limits.max_model_len
        self.liveness.start(self.dp_size)
        if self.metrics is not None:
            for g in range(self.dp_size):
                self.metrics.init_rank(g)
        return self.limits

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._recv_task = loop.create_task(self._recv_loop(), name="async-llm-recv")
        self._watch_task = loop.create_task(self._watch_ranks(), name="async-llm-liveness")

    async def close(self) -> None:
        for task in (self._watch_task, self._recv_task):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._client.close()
        self.prompts.close()

    @property
    def num_inflight(self) -> int:
        return len(self._requests)

    def request_ids(self) -> list[str]:
        return list(self._requests)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def abort_all(self, failure: RequestFailure | None = None) -> None:
        """End every request: as its client's abort, or (with `failure`) as an error its client is told."""
        for rid in list(self._requests):
            self.abort(rid, failure)

    # ------------------------------------------------------------------ requests

    def check_prompt(self, input_ids: list[int], sampling: SamplingParams) -> None:
        """Validate and fit a request to the model; raises ValueError / PromptTooLong for a 400."""
        check_not_empty(input_ids)
        sampling.verify()
        limits = self.limits
        if limits is not None:
            check_fits(len(input_ids), limits)
        self.check_token_ids("prompt", input_ids)
        self.check_token_ids("stop_token_ids", sampling.stop_token_ids)
        if limits is None:
            return
        sampling.max_new_tokens = room_for(len(input_ids), sampling.max_new_tokens, limits)

    def check_token_ids(self, param: str, ids: list[int]) -> None:
        """ValueError naming `param` for an id outside the model's vocabulary (or, when its size is not
        known, outside what a token id can be)."""
        check_token_ids(param, ids, self.vocab_size)

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        rid: str | None = None,
        stream: bool = False,
        internal: bool = False,
    ) -> AsyncIterator[SequenceOutput]:
        """Run one sequence; yields deltas (streaming) or one final output. Raises before the first yield
        for a bad request (ValueError) or an unavailable server (ServerUnavailable). `internal` requests
        (warm-up) run before the server accepts traffic."""
        if not (self.accepting or internal):
            raise ServerUnavailable("the server is not accepting requests (starting up or shutting down)")
        if self.liveness.stalled is not None:
            raise ServerUnavailable(self.liveness.stalled)
        self.check_prompt(input_ids, sampling)
        rid = rid or uuid.uuid4().hex
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use; send a unique rid")
        req = TrackedRequest(
            rid=rid,
            input_ids=input_ids,
            sampling=sampling,
            detok=IncrementalDetokenizer(self.tokenizer, input_ids, sampling),
            wake_every=self.stream_interval if stream else 0,
            arrival=time.time(),
            logprobs=[] if sampling.logprobs else None,
            top_logprobs=[] if sampling.logprobs and sampling.top_logprobs else None,
        )
        # Registered from here on: whatever happens next, the `finally` below removes the request (a
        # failure to send it included), so nothing is left in flight for ever.
        self._requests[rid] = req
        self.inflight_tokens += len(input_ids)
        self._idle.clear()
        failure: RequestFailure | None = None
        try:
            self._log.received(req)
            # Always streamed from the scheduler: token arrival times feed TTFT and inter-token latency,
            # and stop strings are found as the text forms; the consumer is still woken only when it wants.
            self._client.send(
                GenerateRequest(
                    rid=rid,
                    input_ids=input_ids,
                    sampling=sampling.to_dict(),
                    stream=True,
                    arrival_time=req.arrival,
                )
            )
            while True:
                await req.event.wait()
                req.event.clear()
                out = req.take()
                yield out
                if out.finished:
                    return
        except Exception as exc:
            failure = RequestFailure.internal(
                f"the request failed inside the server: {type(exc).__name__}: {exc}"
            )
            raise
        finally:
            if not req.finished:
                # The consumer left early (client disconnect, cancellation), or sending failed: free the
                # scheduler's pages, and count the request as what ended it.
                self.abort(rid, failure)
            self._forget(rid)

    def abort(self, rid: str, failure: RequestFailure | None = None) -> bool:
        """End a request now: its client's abort, or (with `failure`) an error its client is told."""
        req = self._requests.get(rid)
        if req is None:
            return False
        self._client.send(AbortRequest(rid=rid))
        if not req.finished:
            self._finish(req, "abort", None, failure)
        return True

    def _forget(self, rid: str) -> None:
        req = self._requests.pop(rid, None)
        if req is not None:
            self.inflight_tokens -= len(req.input_ids)
        if not self._requests:
            self._idle.set()

    # ------------------------------------------------------------------ control calls

    async def rpc(self, method: str, args: dict | None = None, timeout: float = 30.0) -> list[RpcResponse]:
        """Send a control call to every DP group; returns one answer per group."""
        return await self._client.acall(method, args, timeout)

    # ------------------------------------------------------------------ receiving

    async def _watch_ranks(self) -> None:
        """A rank silent past the timeout stalls the server: what is in flight ends with an error."""
        while True:
            await asyncio.sleep(CHECK_S)
            stalled, changed = self.liveness.check()
            if not changed:
                continue
            if stalled is None:
                logger.warning("the scheduler responds again: the server is no longer stalled")
                continue
            logger.error("%s; failing %d request(s) in flight", stalled, len(self._requests))
            self.abort_all(RequestFailure(503, "scheduler_stalled", stalled))

    async def _recv_loop(self) -> None:
        while True:
            msg = await self._client.areceive()
            try:
                if isinstance(msg, BatchOutput):
                    now = time.time()
                    for o in msg.outputs:
                        self._on_output(o, now)
                    if msg.outputs:
                        self.liveness.heard(msg.outputs[0].dp_rank)
                elif isinstance(msg, StatsSnapshot):
                    self.liveness.heard(msg.dp_rank)
                    self.rank_stats[msg.dp_rank] = msg
                    if self.metrics is not None:
                        self.metrics.observe_stats(msg)
            except Exception:
                logger.exception("failed to handle a scheduler message")

    def _on_output(self, o: RequestOutput, now: float) -> None:
        req = self._requests.get(o.rid)
        if req is None or req.finished:
            return  # aborted or stopped here already; the scheduler's late words do not matter
        req.dp_rank = o.dp_rank
        if not req.rank_known:
            req.rank_known = True
            if self.metrics is not None:
                self.metrics.on_request_received(o.dp_rank)
        req.prompt_tokens = o.prompt_tokens or req.prompt_tokens
        req.cached_tokens = max(req.cached_tokens, o.cached_tokens)
        if req.first_scheduled is None:
            req.first_scheduled = o.first_scheduled_time
        if o.prompt_logprobs is not None:
            req.prompt_logprobs = o.prompt_logprobs
        if o.new_token_ids:
            k = len(o.new_token_ids)
            if req.first_token is None:
                req.first_token = now
            elif req.last_token is not None:
                req.itl.extend([(now - req.last_token) / k] * k)
            req.last_token = now
            req.ids.extend(o.new_token_ids)
            if req.logprobs is not None and o.new_logprobs:
                req.logprobs.extend(o.new_logprobs)
            if req.top_logprobs is not None and o.new_top_logprobs:
                req.top_logprobs.extend(o.new_top_logprobs)
        delta, stopped = req.detok.append(o.new_token_ids, final=o.finished)
        if delta:
            req.text.append(delta)
        if stopped:
            if not o.finished:
                self._client.send(AbortRequest(rid=o.rid))
            self._finish(req, "stop", req.detok.matched_stop, None)
        elif o.finished:
            self._finish(req, o.finish_reason or "stop", o.matched_stop, _scheduler_failure(o))
        elif req.wake_every and (len(req.ids) >= req.wake_every or not req.sent_any):
            req.sent_any = True
            req.event.set()

    def _finish(
        self, req: TrackedRequest, reason: str, matched: str | int | None, failure: RequestFailure | None
    ) -> None:
        if not req.detok.stopped:
            tail = req.detok.flush()
            if tail:
                req.text.append(tail)
        req.finished = True
        req.finish_reason = failure.finish_reason if failure is not None else reason
        req.matched_stop = matched
        req.failure = failure
        req.event.set()
        end = time.time()
        stats = FinishedRequestStats(
            dp_rank=req.dp_rank,
            prompt_tokens=req.prompt_tokens or len(req.input_ids),
            completion_tokens=len(req.detok.output_ids),
            cached_tokens=req.cached_tokens,
            finish_reason=req.finish_reason,
            e2e_latency=end - req.arrival,
            ttft=None if req.first_token is None else req.first_token - req.arrival,
            inter_token_latencies=req.itl,
            queue_time=req.queue_time,
        )
        if self.metrics is not None:
            if not req.rank_known:
                self.metrics.on_request_received(req.dp_rank)
            self.metrics.on_request_finished(stats)
        self._log.finished(req, stats)


def _scheduler_failure(o: RequestOutput) -> RequestFailure | None:
    """The failure a scheduler reported with a request's last output, if any. One it refused before ever
    scheduling it was refused as sent (400); one that failed while running is an internal error."""
    if not o.error:
        return None
    if o.first_scheduled_time is None and not o.completion_tokens:
        return RequestFailure.rejected(o.error)
    return RequestFailure.internal(o.error)
