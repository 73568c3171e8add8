"""From Prometheus text to the numbers an operator reads: gauges, rates, and p50/p99 from histogram buckets.

Servers export cumulative histograms; a percentile "now" is computed from the *difference* of two
scrapes' buckets (the observations made inside the window), interpolated linearly inside the bucket
where the rank falls, as Prometheus' `histogram_quantile` does. Shared by the supervisor (which keeps
the summaries in its history) and the console (which draws them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "tokenspeed:"
METRIC_KEYS = (
    "running",
    "waiting",
    "kv_usage",
    "prefix_hit_rate",
    "gen_throughput",
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "queue_p50",
    "queue_p99",
    "requests_total",
    "errors_total",
    # Over the window (the last 30 s of scrapes): HTTP 4xx/5xx answers plus aborted requests, and
    # preemptions (requests recomputed for lack of KV pages).
    "errors",
    "preemptions",
    # Requests the front end holds (queued, running or streaming), and scheduler steps run so far.
    "in_flight",
    "steps_total",
    # Seconds since the least recently heard scheduler rank reported to its front end (every second
    # while it runs, idle or busy): a stopped scheduler shows here with nothing in flight.
    "heartbeat_age",
    # EPLB balancedness (mean/max tokens per EP rank) of the least balanced MoE layer; None without MoE.
    "balancedness",
)


@dataclass
class Scrape:
    """One parsed /metrics page: plain samples summed over labels, and histogram buckets by `le`."""

    t: float
    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    labelled: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse(text: str, t: float) -> Scrape:
    """Parse exposition text; names lose the `tokenspeed:` prefix; label sets are summed."""
    scrape = Scrape(t)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(PREFIX)
            if name.endswith("_bucket"):
                le = float(sample.labels.get("le", "inf"))
                hist = scrape.buckets.setdefault(name[: -len("_bucket")], {})
                hist[le] = hist.get(le, 0.0) + sample.value
                continue
            if name.endswith("_created"):
                continue
            scrape.values[name] = scrape.values.get(name, 0.0) + sample.value
            if sample.labels:
                scrape.labelled.setdefault(name, []).append((dict(sample.labels), sample.value))
    return scrape


def bucket_delta(new: dict[float, float], old: dict[float, float] | None) -> dict[float, float]:
    """Cumulative counts observed between two scrapes (a server restart resets counters: take `new`)."""
    if not old:
        return dict(new)
    delta = {le: count - old.get(le, 0.0) for le, count in new.items()}
    if any(v < 0 for v in delta.values()):
        return dict(new)
    return delta


def quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """The q-quantile of cumulative buckets {upper bound: count}; None when nothing was observed."""
    if not cumulative:
        return None
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if math.isinf(bound):
                # Above the last finite bucket nothing is known but the bound itself.
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return bounds[-1]


def _first(scrape: Scrape, *names: str) -> float | None:
    for name in names:
        value = scrape.get(name)
        if value is not None:
            return value
    return None


def _rate(new: Scrape, old: Scrape | None, *names: str) -> float | None:
    if old is None or new.t <= old.t:
        return None
    now, before = _first(new, *names), _first(old, *names)
    if now is None or before is None:
        return None
    return max(now - before, 0.0) / (new.t - old.t) if now >= before else now / (new.t - old.t)


def summarize(new: Scrape, old: Scrape | None = None) -> dict[str, float | None]:
    """The fleet table's metrics from the latest scrape and one from the start of the window."""
    out: dict[str, float | None] = dict.fromkeys(METRIC_KEYS)
    out["running"] = new.get("num_requests_running")
    out["waiting"] = new.get("num_requests_waiting")
    out["kv_usage"] = new.get("kv_cache_usage_perc")
    out["gen_throughput"] = _first(new, "gen_throughput")
    if out["gen_throughput"] is None:
        out["gen_throughput"] = _rate(new, old, "generation_tokens_total", "generation_tokens")
    hits = _first(new, "prefix_cache_hits_total", "prefix_cache_hits")
    queries = _first(new, "prefix_cache_queries_total", "prefix_cache_queries")
    if hits is not None and queries is not None:
        old_hits = _first(old, "prefix_cache_hits_total", "prefix_cache_hits") if old else None
        old_queries = _first(old, "prefix_cache_queries_total", "prefix_cache_queries") if old else None
        if old_hits is not None and old_queries is not None and queries > old_queries >= 0:
            out["prefix_hit_rate"] = (hits - old_hits) / (queries - old_queries)
        elif queries > 0:
            out["prefix_hit_rate"] = hits / queries
    for key, hist in (
        ("ttft", "time_to_first_token_seconds"),
        ("itl", "inter_token_latency_seconds"),
        ("queue", "request_queue_time_seconds"),
    ):
        if hist in new.buckets:
            window = bucket_delta(new.buckets[hist], old.buckets.get(hist) if old else None)
            out[f"{key}_p50"] = quantile(0.5, window)
            out[f"{key}_p99"] = quantile(0.99, window)
    out["requests_total"] = _first(new, "num_requests_total", "num_requests", "request_success_total")
    out["errors_total"] = _first(
        new, "request_errors_total", "num_request_errors_total", "num_aborted_requests_total"
    )
    if out["errors_total"] is None and "request_success_total" in new.labelled:
        failed = [
            v
            for labels, v in new.labelled["request_success_total"]
            if labels.get("finished_reason") in ("abort", "error")
        ]
        out["errors_total"] = sum(failed) if failed else 0.0
    out["errors"] = _window_errors(new, old)
    out["preemptions"] = _delta(new, old, "num_preemptions_total", "num_preemptions")
    # The front end's count, or what the schedulers last reported, whichever is larger (a stopped
    # scheduler reports nothing new; a front end that does not export its count reads 0).
    scheduled = None if out["running"] is None else out["running"] + (out["waiting"] or 0.0)
    known = [v for v in (new.get("num_requests_inflight"), scheduled) if v is not None]
    out["in_flight"] = max(known) if known else None
    out["steps_total"] = _first(new, "scheduler_steps_total", "scheduler_steps")
    ages = [v for _labels, v in new.labelled.get("scheduler_heartbeat_age_seconds", [])]
    out["heartbeat_age"] = max(ages) if ages else None
    per_layer = [v for _labels, v in new.labelled.get("eplb_balancedness", [])]
    out["balancedness"] = min(per_layer) if per_layer else new.get("eplb_balancedness")
    return out


def _delta(new: Scrape, old: Scrape | None, *names: str) -> float | None:
    """How much a counter grew over the window (its whole value without an older scrape, or after a reset)."""
    now = _first(new, *names)
    if now is None:
        return None
    before = _first(old, *names) if old is not None else None
    return now if before is None or now < before else now - before


def _labelled_sum(scrape: Scrape | None, name: str, keep) -> float | None:
    if scrape is None or name not in scrape.labelled:
        return None
    return sum(v for labels, v in scrape.labelled[name] if keep(labels))


def _window_errors(new: Scrape, old: Scrape | None) -> float | None:
    """HTTP 4xx/5xx answers (what clients saw) plus aborted requests, over the window; a server without
    the HTTP status counter counts finished requests whose reason is abort or error."""

    def http_errors(labels: dict) -> bool:
        return labels.get("status", "").isdigit() and int(labels["status"]) >= 400

    def aborted(labels: dict) -> bool:
        return labels.get("finished_reason") == "abort"

    def failed(labels: dict) -> bool:
        return labels.get("finished_reason") in ("abort", "error")

    http = _labelled_sum(new, "http_responses_total", http_errors)
    finished_keep = aborted if http is not None else failed
    finished = _labelled_sum(new, "request_success_total", finished_keep)
    if http is None and finished is None:
        return None
    now = (http or 0.0) + (finished or 0.0)
    if old is None:
        return now
    before = (_labelled_sum(old, "http_responses_total", http_errors) or 0.0) + (
        _labelled_sum(old, "request_success_total", finished_keep) or 0.0
    )
    return now if now < before else now - before
