"""Prometheus metrics of one server, in a private registry (never the process-global default one).

Fed from two sides: the schedulers' `StatsSnapshot`s (queue, KV cache, prefix cache, preemptions, step
sizes) and the front end's request lifecycle (tokens, latencies, outcomes). Names carry the `tokenspeed:`
prefix; labels are `model_name` and `dp_rank`, plus `app_key` when `--app-key` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenspeed.runtime.engine.io_struct import StatsSnapshot
from tokenspeed.runtime.metrics.families import PREFIX, MetricFamilies
from tokenspeed.runtime.metrics.spec_metrics import SpecDecodeMetrics
from tokenspeed.runtime.moe.expert_metrics import ExpertMetrics

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Latency buckets from sub-millisecond CPU decode steps to minute-long requests.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0)  # fmt: skip
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0)  # fmt: skip
# Request phases: a queue wait or a prefill can be a millisecond on an idle server and minutes behind a backlog.
_PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                  20.0, 30.0, 40.0, 60.0, 120.0, 240.0, 480.0)  # fmt: skip
_PHASE_DOCS = {
    "queue": "Time from arrival to first being scheduled.",
    "prefill": "Time from first being scheduled to the first token.",
    "decode": "Time from the first token to finish.",
    "inference": "Time from first being scheduled to finish.",
}
_ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Tokens per request, prompt or generated: powers of two up to long contexts.
_REQUEST_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                          131072)  # fmt: skip


@dataclass
class FinishedRequestStats:
    """What the front end measured for one finished sequence."""

    dp_rank: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str  # stop | length | abort | error
    e2e_latency: float
    ttft: float | None = None
    inter_token_latencies: list[float] = field(default_factory=list)
    # Arrival to the scheduler first putting the request in a batch; None if it never was (aborted while
    # waiting), and then no phase (queue, prefill, decode, inference) is observed.
    queue_time: float | None = None

    def phases(self) -> RequestPhases | None:
        """The request's time split at first scheduling and first token, or None without first scheduling.

        Every phase is derived from e2e, TTFT and queue time, so queue + inference = e2e and
        prefill + decode = inference hold exactly (up to clamping at zero, which only matters if a remote
        scheduler's clock is behind the front end's)."""
        if self.queue_time is None:
            return None
        queue = min(max(self.queue_time, 0.0), self.e2e_latency)
        first_token = self.e2e_latency if self.ttft is None else min(max(self.ttft, queue), self.e2e_latency)
        return RequestPhases(
            queue=queue,
            prefill=first_token - queue,
            decode=self.e2e_latency - first_token,
            inference=self.e2e_latency - queue,
        )


@dataclass(frozen=True)
class RequestPhases:
    """Seconds of one request: queue (arrival -> first scheduled), prefill (-> first token), decode (first
    token -> finish), inference (first scheduled -> finish)."""

    queue: float
    prefill: float
    decode: float
    inference: float


class ServerMetrics:
    def __init__(self, model_name: str, app_key: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.app_key = app_key
        labels = ["model_name", "dp_rank"] + (["app_key"] if app_key else [])
        # Last snapshot of each rank: its cumulative counts move the Prometheus counters by the difference.
        self._last: dict[int, StatsSnapshot] = {}
        # process_* (CPU seconds, resident memory, open fds, start time) of this front-end process: a
        # restarted server shows up as a new process_start_time_seconds.
        ProcessCollector(registry=self.registry)

        families = self._families = MetricFamilies(self.registry, labels)
        gauge, counter, histogram = families.gauge, families.counter, families.histogram

        # Scheduler
        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests queued, not yet scheduled.")
        self.num_preemptions = counter(
            "num_preemptions", "Requests preempted (recomputed) for lack of KV pages."
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens computed per engine step.", _ITERATION_TOKEN_BUCKETS
        )
        self.gen_throughput = gauge("gen_throughput", "Generated tokens per second, recent window.")
        self.num_nan_aborted = counter(
            "num_nan_aborted_requests", "Requests aborted because logits held NaN."
        )
        # KV cache
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Fraction (0..1) of KV cache pages in use.")
        self.kv_cache_total_tokens = gauge("kv_cache_total_tokens", "KV cache capacity in tokens.")
        self.kv_cache_used_tokens = gauge("kv_cache_used_tokens", "KV cache tokens in use.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        # Requests
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens of finished requests.")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the prefix cache.")
        self.num_requests = counter("num_requests", "Requests received (one per sequence).")
        self.request_success = counter(
            "request_success", "Requests finished, by reason.", extra=("finished_reason",)
        )
        self.num_requests_inflight = gauge("num_requests_inflight", "Requests the front end is tracking.")
        # Answers to clients by HTTP status (4xx: refused, 5xx: failed or unavailable), from the front end.
        self.http_responses = Counter(
            PREFIX + "http_responses",
            "HTTP responses to clients, by status code (monitoring routes left out).",
            ["model_name", "status"] + (["app_key"] if app_key else []),
            registry=self.registry,
        )
        # Scheduler steps run (rank 0 of each DP rank): a server with requests whose count stands still is
        # stalled, whatever its other gauges say.
        self.scheduler_steps = counter("scheduler_steps", "Scheduler steps run (batches computed).")
        # Seconds since the rank last reported (it reports at least every second, idle or busy): a stopped
        # or hung scheduler shows here even with nothing in flight (scheduler_liveness.py).
        self.heartbeat_age = gauge(
            "scheduler_heartbeat_age_seconds",
            "Seconds since the scheduler rank last reported to the front end.",
        )
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.tpot = histogram(
            "request_time_per_output_token_seconds",
            "Decode time per output token, per request.",
            _ITL_BUCKETS,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Request latency, arrival to finish.", _E2E_BUCKETS
        )
        # Request phases (vLLM's names, request_<phase>_time_seconds), keyed by RequestPhases' fields:
        # observed once per finished request that was ever scheduled.
        self.phase_times = {
            phase: histogram(f"request_{phase}_time_seconds", doc, _PHASE_BUCKETS)
            for phase, doc in _PHASE_DOCS.items()
        }
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per finished request.", _REQUEST_TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per finished request.", _REQUEST_TOKEN_BUCKETS
        )
        # MoE expert load and EPLB (series appear once a MoE scheduler reports them)
        self.experts = ExpertMetrics(self.registry, labels)
        self.spec = SpecDecodeMetrics(families)

    def _labels(self, dp_rank: int) -> dict[str, str]:
        out = {"model_name": self.model_name, "dp_rank": str(dp_rank)}
        if self.app_key:
            out["app_key"] = self.app_key
        return out

    def init_rank(self, dp_rank: int) -> None:
        """Create every labelled series of a rank at zero, so scrapers see them before any traffic."""
        self._families.init_rank(self._labels(dp_rank))

    def observe_stats(self, snap: StatsSnapshot) -> None:
        labels = self._labels(snap.dp_rank)
        last = self._last.get(snap.dp_rank, StatsSnapshot(dp_rank=snap.dp_rank))
        self.num_requests_running.labels(**labels).set(snap.num_running)
        self.num_requests_waiting.labels(**labels).set(snap.num_waiting)
        self.gen_throughput.labels(**labels).set(snap.gen_throughput)
        self.kv_cache_usage.labels(**labels).set(snap.kv_usage)
        self.kv_cache_total_tokens.labels(**labels).set(snap.kv_pages_total * snap.block_size)
        self.kv_cache_used_tokens.labels(**labels).set(snap.kv_pages_used * snap.block_size)
        for name, counter in (
            ("prefix_cache_hits", self.prefix_cache_hits),
            ("prefix_cache_queries", self.prefix_cache_queries),
            ("num_preemptions", self.num_preemptions),
            ("num_nan_aborted", self.num_nan_aborted),
        ):
            value = getattr(snap, name)
            delta = value - getattr(last, name)
            # A smaller value means the rank restarted its count (flush_cache): count from there.
            counter.labels(**labels).inc(delta if delta >= 0 else value)
        self._last[snap.dp_rank] = snap
        hist = self.iteration_tokens.labels(**labels)
        for n in snap.iteration_tokens:
            hist.observe(n)
        # iteration_tokens holds one entry per step since the last snapshot
        self.scheduler_steps.labels(**labels).inc(len(snap.iteration_tokens))
        self.experts.observe(snap, labels)
        self.spec.observe(snap, labels)

    def on_request_received(self, dp_rank: int = 0) -> None:
        self.num_requests.labels(**self._labels(dp_rank)).inc()

    def watch_process_tree(self, child_names: Callable[[], dict[int, str]]) -> None:
        """Export the CPU and memory of every process of the server, the schedulers included (process_*
        is the front end's alone); `child_names` gives {pid: name} of the front end's children."""
        from tokenspeed.runtime.metrics.process_tree import ProcessTreeCollector

        labels = {"model_name": self.model_name, **({"app_key": self.app_key} if self.app_key else {})}
        self.registry.register(ProcessTreeCollector(PREFIX, labels, child_names))

    def set_heartbeat_ages(self, ages: dict[int, float]) -> None:
        for dp_rank, age in ages.items():
            self.heartbeat_age.labels(**self._labels(dp_rank)).set(age)

    def set_inflight(self, n: int, dp_rank: int = 0) -> None:
        self.num_requests_inflight.labels(**self._labels(dp_rank)).set(n)

    def on_request_finished(self, s: FinishedRequestStats) -> None:
        labels = self._labels(s.dp_rank)
        self.prompt_tokens.labels(**labels).inc(s.prompt_tokens)
        self.generation_tokens.labels(**labels).inc(s.completion_tokens)
        self.cached_tokens.labels(**labels).inc(s.cached_tokens)
        self.request_success.labels(**labels, finished_reason=s.finish_reason).inc()
        self.e2e.labels(**labels).observe(s.e2e_latency)
        if s.ttft is not None:
            self.ttft.labels(**labels).observe(s.ttft)
        itl = self.itl.labels(**labels)
        for gap in s.inter_token_latencies:
            itl.observe(gap)
        if s.ttft is not None and s.completion_tokens > 1:
            self.tpot.labels(**labels).observe((s.e2e_latency - s.ttft) / (s.completion_tokens - 1))
        self.request_prompt_tokens.labels(**labels).observe(s.prompt_tokens)
        self.request_generation_tokens.labels(**labels).observe(s.completion_tokens)
        phases = s.phases()
        if phases is not None:
            for phase, seconds in asdict(phases).items():
                self.phase_times[phase].labels(**labels).observe(seconds)

    def on_http_response(self, status: int) -> None:
        labels = {"model_name": self.model_name, "status": str(status)}
        if self.app_key:
            labels["app_key"] = self.app_key
        self.http_responses.labels(**labels).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
