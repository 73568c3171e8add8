"""EngineCore: one rank's scheduler, KV cache and model runner behind a small synchronous API.

The scheduler process of the server and the offline Engine drive it the same way:

    core = EngineCore(server_args)
    core.add_request(GenerateRequest(rid, input_ids, sampling))   # ValueError for a bad request
    while core.has_unfinished():
        for out in core.step(): ...                                # RequestOutput deltas
    core.abort_request(rid, reason="stop")                         # stop string seen by the front end

A request with `stream=False` reports once, when it finishes; a streaming one every
`--stream-interval` tokens.

With overlap scheduling (the default on a GPU, off with --device cpu) a step launches its batch and then
resolves the one the previous step left on the device (see engine/overlap.py), so a step's outputs come
from the batch before. `has_unfinished()` stays true while a batch is in flight, so the
drivers above step until everything is resolved.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import torch

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.slices import GraphConfig, RunnerConfig
from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.kv_cache_manager import KVCacheManager
from tokenspeed.runtime.cache.prefix_cache import create_prefix_cache
from tokenspeed.runtime.distributed.peer_sync import NoPeers, PeerSync
from tokenspeed.runtime.engine.io_struct import GenerateRequest, RequestOutput, StatsSnapshot
from tokenspeed.runtime.engine.overlap import InFlightBatch, needs_host_tokens, overlap_mode
from tokenspeed.runtime.engine.prompt_check import check_prompt
from tokenspeed.runtime.engine.request_state import ModelLimits
from tokenspeed.runtime.execution.model_runner import ModelRunner
from tokenspeed.runtime.grammar.admission import GrammarAdmission
from tokenspeed.runtime.models.model_config import ModelConfig
from tokenspeed.runtime.moe.rank_experts import EXPERT_RECORD_METHODS, ExpertController, NoExperts
from tokenspeed.runtime.scheduler.request import Request
from tokenspeed.runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from tokenspeed.runtime.speculative.config import SpecConfig
from tokenspeed.runtime.speculative.proposer import create_proposer
from tokenspeed.runtime.speculative.stats import SpecDecodeStats
from tokenspeed.runtime.startup_phases import StartupPhases
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_ABORT_REASONS = ("abort", "stop")
_THROUGHPUT_WINDOW_S = 5.0


def init_device(device: torch.device) -> None:
    """Create the CUDA context now, where its seconds are booked as such, not in whichever phase first
    touches the GPU (on a fresh H200 machine the context and the driver's module loading take seconds)."""
    if device.type == "cuda":
        torch.zeros(1, device=device)  # a kernel launch: the context exists and the driver is loaded


def resolve_device(server_args: ServerArgs, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if server_args.device == "cuda":
        return torch.device("cuda", server_args.base_gpu_id)
    return torch.device(server_args.device)


class EngineCore:
    def __init__(
        self,
        server_args: ServerArgs,
        *,
        dp_rank: int = 0,
        device: torch.device | str | None = None,
        peers: PeerSync | None = None,
        experts: ExpertController | None = None,
        startup: StartupPhases | None = None,
    ):
        """`peers` and `experts` (tokenspeed.runtime.distributed): set when this rank has TP/EP peers or
        manages MoE experts; the runner then loads this rank's shard and rank 0 leads its peers' steps.
        `startup`: where the seconds of each start-up phase are booked (the ready message reports them)."""
        self.server_args = server_args
        self.config = RunnerConfig.from_server_args(server_args)
        self.dp_rank = dp_rank
        self.device = resolve_device(server_args, device)
        self.peers: PeerSync = peers if peers is not None else NoPeers()
        self.experts: ExpertController = experts if experts is not None else NoExperts()
        self.startup = startup if startup is not None else StartupPhases()
        with self.startup.phase("device init"):
            init_device(self.device)
            torch.manual_seed(self.config.seed)
        with self.startup.phase("model config"):  # mostly importing transformers, for AutoConfig
            self.model_config = ModelConfig.from_server_args(server_args)
        self.runner = ModelRunner(
            self.config,
            GraphConfig.from_server_args(server_args),
            self.model_config,
            self.device,
            max_num_reqs=self.config.max_num_seqs,
            peers=self.peers,
            experts=self.experts,
            startup=self.startup,
        )
        with self.startup.phase("scheduler"):
            self._build_scheduler(server_args)
        # Generated tokens per step over the last few seconds, so gen_throughput does not depend on how
        # often stats() is called; iteration_tokens is drained by each stats() call.
        self._started = time.monotonic()
        self._gen_events: collections.deque[tuple[float, int]] = collections.deque()
        self._iteration_tokens: collections.deque[int] = collections.deque(maxlen=4096)
        self._num_nan_aborted = 0
        self.spec = SpecConfig.from_server_args(server_args)
        self.spec_stats = SpecDecodeStats()
        self.proposer = None
        if self.spec is not None:
            with self.startup.phase("speculative draft"):
                self.proposer = create_proposer(self.spec, self.runner, self.kv)
        self.overlap, why = overlap_mode(self.config, has_peers=not self.peers.alone)
        if self.spec is not None:
            if peers is not None:
                raise ValueError(
                    f"--speculative-algorithm {self.spec.algorithm} runs on single-rank servers in this build; "
                    "drop --tp/--ep (or the speculative flags)"
                )
            # Drafts are proposed from the tokens of the step before, so each step waits for them.
            self.overlap, why = False, "off (speculative decoding: drafts need the previous step's tokens)"
        logger.info("overlap scheduling: %s", why)
        self._in_flight: InFlightBatch | None = None
        with self.startup.phase("tokenizer and grammar"):
            self._grammars = self._grammar_admission(server_args)

    def _build_scheduler(self, server_args: ServerArgs) -> None:
        """The page allocator, prefix cache and scheduler over the runner's KV pool."""
        bs = self.config.block_size
        allocator = PageAllocator(self.runner.kv_pool.num_pages)
        prefix_cache = create_prefix_cache(self.config.enable_prefix_caching, allocator, bs)
        self.kv = KVCacheManager(allocator, self.runner.req_to_token, prefix_cache)
        self.max_model_len = self.model_config.max_model_len
        self.max_total_tokens = allocator.num_allocatable * bs
        self.max_req_input_len = min(self.max_model_len - 1, self.max_total_tokens - 1)
        self.limits = ModelLimits(self.max_total_tokens, self.max_req_input_len, self.max_model_len)
        self.scheduler = Scheduler(SchedulerConfig.from_server_args(server_args, self.max_model_len), self.kv)
        self.stream_interval = self.config.stream_interval
        self._eos = frozenset(self.model_config.eos_token_ids)
        self._vocab_size = self.model_config.vocab_size

    def _grammar_admission(self, server_args: ServerArgs) -> GrammarAdmission | None:
        if server_args.grammar_backend == "none":
            return None
        from tokenspeed.runtime.engine.tokenizer import get_tokenizer
        from tokenspeed.runtime.grammar.backend import GrammarBackend, check_installed

        check_installed(server_args.grammar_backend)
        tokenizer = get_tokenizer(server_args)
        if tokenizer is None:
            return None  # --skip-tokenizer-init: requests with a grammar are refused in add_request
        backend = GrammarBackend(
            tokenizer,
            self._vocab_size,
            sorted(self._eos),
            timeout_s=server_args.grammar_compile_timeout_secs,
            max_retries=server_args.grammar_compile_max_retries,
            any_whitespace=not server_args.disable_any_whitespace,
            name=server_args.grammar_backend,
        )
        return GrammarAdmission(backend)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, request: GenerateRequest) -> None:
        sp = SamplingParams.from_dict(request.sampling)
        sp.verify()
        if sp.grammar is not None and self._grammars is None:
            raise ValueError(
                f"{sp.grammar[0]}: structured output is off on this server; start it with "
                "--grammar-backend xgrammar or llguidance (and a tokenizer)"
            )
        ids = list(request.input_ids)
        check_prompt(ids, self.limits, self._vocab_size)
        generator = None
        if sp.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(sp.seed)
        req = Request(
            rid=request.rid,
            prompt_ids=ids,
            sampling=sp,
            eos_token_ids=self._eos,
            stream=request.stream,
            arrival_time=request.arrival_time or time.time(),
            generator=generator,
        )
        if sp.grammar is not None and sp.max_new_tokens != 0:
            self._grammars.add(req)  # joins the scheduler once its grammar is compiled
            return
        self.scheduler.add_request(req)
        if sp.max_new_tokens == 0 and sp.prompt_logprobs is None:  # else it runs to score its prompt
            self.scheduler.abort_request(req.rid, reason="length")

    def _admit_compiled(self) -> None:
        if not self._grammars:
            return
        if not self.scheduler.has_unfinished() and self._in_flight is None:
            self._grammars.wait(0.01)  # nothing else to run: wait for a compile instead of spinning
        for req, error in self._grammars.ready():
            self.scheduler.add_request(req)
            if error is not None:
                self.scheduler.abort_request(req.rid, reason="abort", error=error)

    def abort_request(self, rid: str, reason: str = "abort") -> bool:
        """Finish a request now; its final output comes from the next step(). False if unknown."""
        if reason not in _ABORT_REASONS:
            raise ValueError(f"abort reason must be one of {_ABORT_REASONS}, got {reason!r}")
        held = self._grammars.remove(rid) if self._grammars is not None else None
        if held is not None:
            self.scheduler.add_request(held)  # so that its final output is reported like any other
        return self.scheduler.abort_request(rid, reason)

    @property
    def startup_seconds(self) -> dict[str, float]:
        """Seconds of this engine's start-up phases, in order (device, model config, weights, KV cache, ...)."""
        return dict(self.startup.seconds)

    def has_unfinished(self) -> bool:
        busy = self.scheduler.has_unfinished() or self._in_flight is not None or bool(self._grammars)
        if not busy:
            self.peers.keepalive()  # idle rank 0: pending expert operations, and a sign of life to peers
        return busy

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        self._admit_compiled()
        # Overlap: schedule k -> launch k -> resolve k-1 -> outputs. Synchronous: resolve k before returning.
        if self._in_flight is not None and not self._may_schedule_ahead():
            self._resolve_in_flight()
        batch = self.scheduler.schedule()
        prev, self._in_flight = self._in_flight, None
        if not batch.is_empty:
            launched = self.runner.launch(batch, prev.launched if prev is not None else None)
            self._in_flight = InFlightBatch(batch, launched)
        if prev is not None:
            self._resolve(prev)
        if self._in_flight is not None and not (self.overlap and self._in_flight.has_live_request()):
            # Nothing to overlap with (or every request in it has just finished): no batch is left behind.
            self._resolve_in_flight()
        outputs = [self._output(req) for req in self.scheduler.pop_outbox()]
        return [o for o in outputs if o is not None]

    def _may_schedule_ahead(self) -> bool:
        """Whether the next batch may be scheduled before the one in flight is resolved."""
        return self.overlap and not any(
            r.num_pending_tokens and needs_host_tokens(r) for r in self.scheduler.running
        )

    def _resolve_in_flight(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        self._resolve(in_flight)

    def _resolve(self, in_flight: InFlightBatch) -> None:
        batch = in_flight.batch
        result = self.runner.resolve(in_flight.launched)
        self.scheduler.apply_prompt_results(batch, result.prompt_logprobs)
        # A request that finished since (aborted, or ended by its previous token) drops its result: it is
        # not shown and not counted.
        live = [not it.req.is_finished for it in batch.items]
        self.scheduler.update_from_output(
            batch, result.token_ids, result.logprobs, result.errors, result.top_logprobs, result.runs
        )
        if result.runs is not None:
            for run, ok in zip(result.runs, live, strict=True):
                if run is not None and ok:
                    self.spec_stats.record(run)
        if self.proposer is not None:
            self.proposer.propose(batch, in_flight.launched)
        self._iteration_tokens.append(batch.num_tokens)
        runs = result.runs or [None] * len(batch.items)
        num_sampled = sum(
            (len(run.tokens) if run is not None else it.sample)
            for it, run, ok in zip(batch.items, runs, live, strict=True)
            if ok
        )
        self._gen_events.append((time.monotonic(), num_sampled))
        if result.errors:
            self._num_nan_aborted += sum(
                e is not None for e, ok in zip(result.errors, live, strict=True) if ok
            )

    def _output(self, req: Request) -> RequestOutput | None:
        pending = req.num_output_tokens - req.num_emitted_tokens
        if not req.is_finished and (not req.stream or pending < self.stream_interval):
            return None
        start = req.num_emitted_tokens
        req.num_emitted_tokens = req.num_output_tokens
        return RequestOutput(
            rid=req.rid,
            new_token_ids=req.output_ids[start:],
            finished=req.is_finished,
            finish_reason=req.finish_reason,
            matched_stop=req.matched_stop,
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=req.num_output_tokens,
            cached_tokens=req.num_cached_tokens,
            new_logprobs=req.output_logprobs[start:] if req.sampling.logprobs else None,
            new_top_logprobs=(
                [[[t, lp] for t, lp in alts] for alts in req.output_top_logprobs[start:]]
                if req.sampling.logprobs and req.sampling.top_logprobs
                else None
            ),
            error=req.error,
            dp_rank=self.dp_rank,
            first_scheduled_time=req.first_scheduled_time,
            # with the first output: every prompt position was computed before the first token
            prompt_logprobs=req.prompt_logprobs if start == 0 else None,
        )

    # ---- state --------------------------------------------------------------------------------
    def stats(self) -> StatsSnapshot:
        now = time.monotonic()
        while self._gen_events and self._gen_events[0][0] < now - _THROUGHPUT_WINDOW_S:
            self._gen_events.popleft()
        window = max(min(_THROUGHPUT_WINDOW_S, now - self._started), 1e-3)
        kv = self.kv.stats()
        snap = StatsSnapshot(
            dp_rank=self.dp_rank,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_pages_used=kv.pages_used,
            kv_pages_total=kv.pages_total,
            block_size=self.kv.block_size,
            prefix_cache_hits=self.kv.hit_tokens,
            prefix_cache_queries=self.kv.query_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            gen_throughput=sum(n for _, n in self._gen_events) / window,
            iteration_tokens=list(self._iteration_tokens),
            num_nan_aborted=self._num_nan_aborted,
            timestamp=time.time(),
            spec_num_drafts=self.spec_stats.num_drafts,
            spec_num_draft_tokens=self.spec_stats.num_draft_tokens,
            spec_num_accepted_tokens=self.spec_stats.num_accepted_tokens,
            spec_acceptance_lengths=self.spec_stats.drain_lengths(),
            spec_mean_acceptance_length=self.spec_stats.mean_acceptance_length,
            spec_accepted_per_pos=list(self.spec_stats.accepted_per_pos),
        )
        self._iteration_tokens.clear()
        experts = self.experts.snapshot()
        if experts is not None:
            snap.expert_layers = experts.layers
            snap.expert_load = experts.load
            snap.expert_rank_load = experts.rank_load
            snap.eplb_balancedness = experts.balancedness
            snap.eplb_rebalances = experts.rebalances
            snap.eplb_rebalance_seconds = experts.rebalance_seconds
        return snap

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests or a batch are in flight."""
        if self.has_unfinished():
            return False
        self.kv.flush()
        return True

    def control(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        """A control call other than flush_cache and stats (the MoE expert calls); ControlRefused when this
        server cannot honour it, ValueError for an unknown one."""
        if method == "rebalance_experts":
            # before the next step, or at once when idle
            self.experts.request_rebalance()
            self.peers.keepalive(rebalance=True)
            return self.experts.rebalance_answer()
        if method in EXPERT_RECORD_METHODS:
            return self.experts.control(method, args, self.dp_rank)
        raise ValueError(f"unknown control call {method!r}")

    def shutdown(self) -> None:
        try:
            for rid in list(self.scheduler.requests):
                self.scheduler.abort_request(rid)
            if self._in_flight is not None:
                self._resolve_in_flight()  # the device finishes with the pool before it is dropped
            self.scheduler.pop_outbox()
        finally:
            try:
                self.runner.shutdown()
            finally:
                self.peers.close()  # rank 0's peers stop; the rank leaves the torch.distributed world
