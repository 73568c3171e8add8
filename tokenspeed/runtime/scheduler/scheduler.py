"""Continuous batching: which requests compute how many tokens in the next step.

Each step has one token budget (`--chunked-prefill-size`; with -1, prefills are whole and bounded by
`--max-prefill-tokens`). Running requests are served first, in arrival order, then waiting ones
(FIFO; preempted requests go back to the front). Without `--enable-mixed-batch`, a step is either
prefill chunks or decodes: prefill work goes first, decodes run in steps with nothing to prefill.

When a running request needs a page and none is left (even after evicting cached pages), the newest
running request is preempted by recompute: its pages go back (its computed full pages stay in the
prefix cache, so the recompute may hit them) and it waits at the front of the queue.

A scheduled batch is committed at once (`num_computed_tokens` advances, a sampling item adds a pending
token), so the next batch can be scheduled before this one's tokens are on the host (overlap scheduling).
`update_from_output` then applies the tokens. A result is dropped for a request that finished meanwhile
(aborted, or ended by its previous token); a request preempted meanwhile keeps the token (it was sampled
from valid K/V) but not the KV progress.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.cache.kv_cache_manager import KVCacheManager
from tokenspeed.runtime.scheduler.batch import ScheduledBatch, ScheduledRequest, VerifiedRun
from tokenspeed.runtime.scheduler.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_model_len: int
    chunked_prefill_size: int | None  # None: chunking disabled
    max_prefill_tokens: int
    enable_mixed_batch: bool = False

    @classmethod
    def from_server_args(cls, args: ServerArgs, max_model_len: int) -> SchedulerConfig:
        chunk = args.chunked_prefill_size
        max_prefill = args.max_prefill_tokens
        return cls(
            max_num_seqs=args.max_num_seqs,
            max_model_len=max_model_len,
            chunked_prefill_size=None if chunk is None or chunk <= 0 else min(chunk, max_prefill),
            max_prefill_tokens=max_prefill,
            enable_mixed_batch=bool(args.enable_mixed_batch),
        )


@dataclass
class _StepBudget:
    tokens: float  # every token of the step (decodes included); inf when chunking is disabled
    prefill_tokens: float
    chunking: bool
    num_prefills: int = 0

    def chunk(self, remaining: int, is_decode: bool, num_drafts: int = 0) -> int:
        if is_decode:
            # a decode with drafts computes them too: as many as the step's budget leaves room for
            return int(min(1 + num_drafts, self.tokens)) if self.tokens >= 1 else 0
        if self.chunking:
            return int(min(remaining, self.tokens, self.prefill_tokens))
        # Whole prompts only; an oversized one may go alone, otherwise it could never run.
        return remaining if remaining <= self.prefill_tokens or self.num_prefills == 0 else 0

    def consume(self, n: int, is_decode: bool) -> None:
        self.tokens -= n
        if not is_decode:
            self.prefill_tokens -= n
            self.num_prefills += 1


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.outbox: list[Request] = []  # requests with new tokens or a finish to report
        self.num_preemptions = 0

    # ---- requests in and out --------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.rid in self.requests:
            raise ValueError(f"request id {req.rid!r} is already running; request ids must be unique")
        self.requests[req.rid] = req
        self.waiting.append(req)

    def abort_request(self, rid: str, reason: str = "abort", error: str | None = None) -> bool:
        req = self.requests.get(rid)
        if req is None:
            return False
        (self.running if req.status is RequestStatus.RUNNING else self.waiting).remove(req)
        self._finish(req, reason, error=error)
        return True

    def _finish(self, req: Request, reason: str | None = None, error: str | None = None) -> None:
        if reason is not None:
            req.finish(reason, error=error)
        req.num_pending_tokens = 0  # tokens still in flight are dropped with their batch's result
        self.kv.release(req)
        self.requests.pop(req.rid, None)
        self.outbox.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self.outbox)

    def pop_outbox(self) -> list[Request]:
        out, self.outbox = self.outbox, []
        return out

    # ---- scheduling -------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        cfg = self.config
        chunking = cfg.chunked_prefill_size is not None
        budget = _StepBudget(
            tokens=cfg.chunked_prefill_size if chunking else float("inf"),
            prefill_tokens=cfg.chunked_prefill_size if chunking else cfg.max_prefill_tokens,
            chunking=chunking,
        )
        batch = ScheduledBatch()
        mixed = cfg.enable_mixed_batch
        self._schedule_running(batch, budget, decodes=mixed, prefills=True)
        if batch.num_preempted == 0:
            self._schedule_waiting(batch, budget)
        if not mixed and batch.is_empty:
            self._schedule_running(batch, budget, decodes=True, prefills=False)
        now = time.time()
        for it in batch.items:
            it.req.num_computed_tokens += it.num_new_tokens
            it.req.num_pending_tokens += it.sample
            if it.req.first_scheduled_time is None:
                it.req.first_scheduled_time = now
        return batch

    def _schedule_running(
        self, batch: ScheduledBatch, budget: _StepBudget, decodes: bool, prefills: bool
    ) -> None:
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if req.num_pending_tokens and req.ends_by_length(self.config.max_model_len):
                i += 1  # its in-flight token ends it; a further one would be discarded
                continue
            remaining = req.num_tokens - req.num_computed_tokens
            is_decode = remaining == 1
            drafts = self._drafts_of(req) if is_decode else []
            n = budget.chunk(remaining, is_decode, len(drafts)) if (decodes if is_decode else prefills) else 0
            if n == 0:
                i += 1
                continue
            if n > 1 and is_decode and not self.kv.grow(req, n):
                n = 1  # pages for drafts never preempt anyone: decode without them
            drafts = drafts[: n - 1] if is_decode else []
            while not self.kv.grow(req, n) and self.running[-1] is not req:
                self._preempt(self.running[-1], batch)
            if req.row is not None and self.kv.pages_for(req.num_computed_tokens + n) <= len(req.pages):
                budget.consume(n, is_decode)
                batch.items.append(ScheduledRequest(req, req.num_computed_tokens, n, drafts))
                i += 1
            elif self.kv.pages_for(req.num_tokens) > self.kv.allocator.num_allocatable:
                # Even alone it cannot fit: the KV pool is its context limit. It ends once its in-flight
                # token (part of its output) is on the host.
                if req.num_pending_tokens:
                    i += 1
                    continue
                self.running.pop(i)
                self._finish(req, "length")
            else:
                self._preempt(req, batch)  # requests ahead of it hold the pages; it retries later

    def _drafts_of(self, req: Request) -> list[int]:
        """The request's proposed drafts that its limits still allow (none while a token is in flight)."""
        if not req.draft_ids or req.num_pending_tokens:
            return []
        return req.draft_ids[: req.max_draft_tokens(self.config.max_model_len)]

    def _schedule_waiting(self, batch: ScheduledBatch, budget: _StepBudget) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.num_pending_tokens:
                break  # preempted while its token was in flight: the prefix to match is not known yet
            if not self.kv.admit(req):
                break
            remaining = req.num_tokens - req.num_computed_tokens
            n = budget.chunk(remaining, False)
            if n == 0 or not self.kv.grow(req, n):
                self.kv.release(req)
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            self.kv.record_admission(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            budget.consume(n, False)
            batch.items.append(ScheduledRequest(req, req.num_computed_tokens, n))

    def _preempt(self, req: Request, batch: ScheduledBatch) -> None:
        self.running.remove(req)
        self.kv.release(req)
        req.num_computed_tokens = 0
        req.epoch += 1
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        batch.num_preempted += 1

    # ---- results ------------------------------------------------------------------------------------
    def apply_prompt_results(
        self, batch: ScheduledBatch, prompt_logprobs: dict[int, tuple[int, list[list]]] | None
    ) -> None:
        """The prompt side of a step's results, before its tokens: prompt_logprobs[i] (first prompt token
        scored, its entries on) belongs to batch.items[i]. A request that asked for no output (max_tokens 0
        with prompt logprobs: it only scores its prompt) ends at the step that would sample its first token.
        """
        for i, item in enumerate(batch.items):
            req = item.req
            if req.is_finished:
                continue
            if prompt_logprobs is not None and i in prompt_logprobs:
                # computed from valid K/V even if preempted since: kept, by position
                first, entries = prompt_logprobs[i]
                req.prompt_logprobs[first : first + len(entries)] = entries
            if item.sample and req.sampling.max_new_tokens == 0 and req.first_missing_prompt_logprob() is None:
                (self.running if req.status is RequestStatus.RUNNING else self.waiting).remove(req)
                req.num_computed_tokens = min(req.num_computed_tokens, len(req.token_ids) - 1)
                self._finish(req, "length")

    def update_from_output(
        self,
        batch: ScheduledBatch,
        token_ids: list[int],
        logprobs: list[float] | None = None,
        errors: list[str | None] | None = None,
        top_logprobs: list[list[tuple[int, float]]] | None = None,
        runs: list[VerifiedRun | None] | None = None,
    ) -> None:
        """Apply a step's results: token_ids[i] (and logprobs[i], errors[i]) belong to batch.items[i];
        runs[i], where set, replaces them with the tokens a verify forward emitted for a drafted item.
        Results of requests that finished since the batch was scheduled are dropped."""
        for i, item in enumerate(batch.items):
            req = item.req
            if req.is_finished:
                continue
            queue = self.running if req.status is RequestStatus.RUNNING else self.waiting
            req.num_pending_tokens -= item.sample
            current = item.epoch == req.epoch  # False: preempted since, its computed tokens were dropped
            if errors is not None and errors[i] is not None:
                queue.remove(req)
                self._finish(req, "abort", error=errors[i])
                continue
            if not item.sample:
                if current:
                    self.kv.share(req)
                continue
            if runs is not None and runs[i] is not None:
                self._apply_run(item, runs[i], queue, current)
                continue
            if req.grammar is not None and not req.grammar.accept(token_ids[i]):
                queue.remove(req)
                self._finish(req, "abort", error=f"token {token_ids[i]} is outside the request's grammar")
                continue
            req.append_token(token_ids[i], self.config.max_model_len)
            if logprobs is not None and req.sampling.logprobs:
                req.output_logprobs.append(logprobs[i])
                if top_logprobs is not None and req.sampling.top_logprobs:
                    req.output_top_logprobs.append(top_logprobs[i][: req.sampling.top_logprobs])
            if req.is_finished:
                queue.remove(req)
                # Work launched after this token (its K/V) is not part of the request: as without overlap,
                # the cache keeps every token but the last.
                req.num_computed_tokens = min(req.num_computed_tokens, len(req.token_ids) - 1)
                self._finish(req)
            else:
                if current:
                    self.kv.share(req)
                self.outbox.append(req)

    def _apply_run(self, item: ScheduledRequest, run: VerifiedRun, queue: list | deque, current: bool) -> None:
        """Append a verified run; tokens after one that ends the request (stop token, length) are dropped.
        The K/V of rejected drafts is rolled back: computed tokens end after the last accepted draft."""
        req = item.req
        for j, token in enumerate(run.tokens):
            req.append_token(token, self.config.max_model_len)
            if run.logprobs is not None and req.sampling.logprobs:
                req.output_logprobs.append(run.logprobs[j])
                if run.top_logprobs is not None and req.sampling.top_logprobs:
                    req.output_top_logprobs.append(run.top_logprobs[j][: req.sampling.top_logprobs])
            if req.is_finished:
                break
        if current:
            req.num_computed_tokens = min(req.num_computed_tokens, item.start + len(run.tokens))
            self.kv.truncate(req)
        if req.is_finished:
            queue.remove(req)
            req.num_computed_tokens = min(req.num_computed_tokens, len(req.token_ids) - 1)
            self._finish(req)
            return
        if current:
            self.kv.share(req)
        self.outbox.append(req)
