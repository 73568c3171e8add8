"""ServerMetrics: a private registry, the tokenspeed: names and labels, counters fed by cumulative stats."""

from __future__ import annotations

import msgpack
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tokenspeed.runtime.engine.io_struct import BatchOutput, RequestOutput, StatsSnapshot, decode, encode
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


def test_request_phase_and_token_histograms():
    m = ServerMetrics("tiny")
    m.init_rank(0)
    labels = (("dp_rank", "0"), ("model_name", "tiny"))
    names = ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
             "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens")  # fmt: skip
    s = samples(m)
    for name in names:  # created at zero before any traffic
        assert s[(f"tokenspeed:{name}_count", labels)] == 0, name
    m.on_request_finished(FinishedRequestStats(dp_rank=0, prompt_tokens=10, completion_tokens=4, cached_tokens=0,
                                               finish_reason="length", e2e_latency=2.0, ttft=0.75,
                                               queue_time=0.5))  # fmt: skip
    # Aborted while waiting: token histograms count it, the phases (never scheduled) do not.
    m.on_request_finished(FinishedRequestStats(dp_rank=0, prompt_tokens=3, completion_tokens=0, cached_tokens=0,
                                               finish_reason="abort", e2e_latency=1.0))  # fmt: skip
    s = samples(m)
    for name, total in (("request_queue_time_seconds", 0.5), ("request_prefill_time_seconds", 0.25),
                        ("request_decode_time_seconds", 1.25), ("request_inference_time_seconds", 1.5)):  # fmt: skip
        assert s[(f"tokenspeed:{name}_count", labels)] == 1, name
        assert s[(f"tokenspeed:{name}_sum", labels)] == total, name
    assert s[("tokenspeed:request_queue_time_seconds_bucket", (*labels[:1], ("le", "0.5"), *labels[1:]))] == 1
    assert (
        s[("tokenspeed:request_queue_time_seconds_bucket", (*labels[:1], ("le", "0.25"), *labels[1:]))] == 0
    )
    assert s[("tokenspeed:request_prompt_tokens_count", labels)] == 2
    assert s[("tokenspeed:request_prompt_tokens_sum", labels)] == 13
    assert s[("tokenspeed:request_generation_tokens_sum", labels)] == 4


def test_phases_stay_consistent_when_clocks_disagree():
    # A scheduler on another node whose clock runs ahead: its first-scheduled time can look later than the
    # first token or even the finish. The phases are clamped so they still add up and are never negative.
    ahead = FinishedRequestStats(dp_rank=0, prompt_tokens=1, completion_tokens=2, cached_tokens=0,
                                 finish_reason="stop", e2e_latency=1.0, ttft=0.2, queue_time=3.0)  # fmt: skip
    p = ahead.phases()
    assert p is not None and (p.queue, p.prefill, p.decode, p.inference) == (1.0, 0.0, 0.0, 0.0)
    behind = FinishedRequestStats(dp_rank=0, prompt_tokens=1, completion_tokens=2, cached_tokens=0,
                                  finish_reason="stop", e2e_latency=1.0, ttft=0.2, queue_time=-0.1)  # fmt: skip
    p = behind.phases()
    assert p is not None and p.queue == 0.0 and p.prefill + p.decode == p.inference == 1.0


def test_request_output_carries_first_scheduled_time_through_msgpack():
    out = BatchOutput(outputs=[RequestOutput(rid="a", new_token_ids=[5], first_scheduled_time=1700000000.25)])
    assert decode(encode(out)).outputs[0].first_scheduled_time == 1700000000.25
    # A message from a sender without the field still decodes, with the default.
    legacy = msgpack.packb(
        ["BatchOutput", {"outputs": [{"rid": "b", "new_token_ids": [1]}]}], use_bin_type=True
    )
    assert decode(legacy).outputs[0].first_scheduled_time is None
