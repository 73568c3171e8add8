"""ServerMetrics: a private registry, the tokenspeed: names and labels, counters fed by cumulative stats."""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tokenspeed.runtime.engine.io_struct import StatsSnapshot
from tokenspeed.runtime.metrics.collector import FinishedRequestStats, ServerMetrics


def samples(m: ServerMetrics) -> dict:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_snapshots_and_requests_feed_the_registry():
    m = ServerMetrics("tiny", app_key="team-a")
    m.init_rank(0)
    labels = (("app_key", "team-a"), ("dp_rank", "0"), ("model_name", "tiny"))
    m.observe_stats(StatsSnapshot(dp_rank=0, num_running=3, num_waiting=2, kv_pages_used=5, kv_pages_total=20,
                                  block_size=16, prefix_cache_hits=32, prefix_cache_queries=64,
                                  iteration_tokens=[7, 9]))  # fmt: skip
    m.observe_stats(StatsSnapshot(dp_rank=0, kv_pages_total=20, block_size=16, prefix_cache_hits=48,
                                  prefix_cache_queries=96))  # fmt: skip
    m.on_request_received(0)
    m.on_request_finished(FinishedRequestStats(dp_rank=0, prompt_tokens=10, completion_tokens=4, cached_tokens=0,
                                               finish_reason="length", e2e_latency=0.5, ttft=0.2,
                                               inter_token_latencies=[0.1, 0.1, 0.1]))  # fmt: skip
    s = samples(m)
    assert s[("tokenspeed:num_requests_running", labels)] == 0
    assert s[("tokenspeed:kv_cache_total_tokens", labels)] == 320
    assert s[("tokenspeed:prefix_cache_hits_total", labels)] == 48  # cumulative values, counted once
    assert s[("tokenspeed:prefix_cache_queries_total", labels)] == 96
    assert s[("tokenspeed:iteration_tokens_total_count", labels)] == 2
    assert s[("tokenspeed:prompt_tokens_total", labels)] == 10
    assert s[("tokenspeed:inter_token_latency_seconds_count", labels)] == 3
    assert (
        s[
            (
                "tokenspeed:request_success_total",
                (
                    ("app_key", "team-a"),
                    ("dp_rank", "0"),
                    ("finished_reason", "length"),
                    ("model_name", "tiny"),
                ),
            )
        ]
        == 1
    )
    # Nothing leaked into the process-global registry.
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("tokenspeed:")]


def test_two_servers_in_one_process_do_not_collide():
    a, b = ServerMetrics("a"), ServerMetrics("b")
    a.init_rank(0)
    b.init_rank(0)
    a.on_request_received(0)
    assert ("tokenspeed:num_requests_total", (("dp_rank", "0"), ("model_name", "b"))) in samples(b)
    assert samples(b)[("tokenspeed:num_requests_total", (("dp_rank", "0"), ("model_name", "b")))] == 0
