"""The supervisor's parts on their own: backoff and crash-loop policy, history, metrics math (log rotation:
test_log_rotation.py)."""

from __future__ import annotations

import time

import pytest

from console import metrics_math
from console.profile.schema import BackoffSpec
from console.supervisor.history import MetricsHistory
from console.supervisor.policy import RestartPolicy
from console.supervisor.states import ExitInfo


def policy(kind: str = "always", max_restarts: int = 3) -> RestartPolicy:
    return RestartPolicy(
        kind, BackoffSpec(initial_s=1, max_s=5, multiplier=2, reset_after_s=30), max_restarts, 60
    )


def test_backoff_doubles_to_the_cap_and_resets_after_a_healthy_period():
    p = policy(max_restarts=100)
    assert [p.next_delay(t) for t in range(5)] == [1, 2, 4, 5, 5]
    p.note_healthy_since(since=100, now=110)  # 10 s up: not long enough
    assert p.next_delay(110) == 5
    p.note_healthy_since(since=100, now=131)
    assert p.next_delay(131) == 1


def test_crash_loop_counts_restarts_inside_the_window_only():
    p = policy(max_restarts=3)
    for t in (0, 1, 2):
        assert not p.crash_looping(t)
        p.next_delay(t)
    assert p.crash_looping(3)
    assert not p.crash_looping(61.5)  # the first two fell out of the 60 s window
    p.reset()
    assert not p.crash_looping(3)


@pytest.mark.parametrize(
    ("kind", "code", "restart"),
    [
        ("always", 0, True),
        ("always", 1, True),
        ("on-failure", 0, False),
        ("on-failure", 2, True),
        ("no", 1, False),
    ],
)
def test_restart_policy_by_exit(kind, code, restart):
    assert policy(kind).wants_restart(ExitInfo(code, None, 0.0)) is restart


def test_exit_info_from_returncode():
    assert ExitInfo.from_returncode(-9, 1.0) == ExitInfo(None, "SIGKILL", 1.0)
    assert ExitInfo.from_returncode(3, 1.0) == ExitInfo(3, None, 1.0)
    assert ExitInfo.from_returncode(-15, 1.0).failed and not ExitInfo.from_returncode(0, 1.0).failed


def test_history_is_bounded_by_age_and_rows(tmp_path):
    history = MetricsHistory(tmp_path / "h.sqlite", retention_s=100, max_rows=50)
    now = time.time()
    for i in range(120):
        history.add("a", now - 200 + i * 2, {"running": i})
    history.prune(now)
    samples = history.query("a", 0)
    assert len(samples) <= 50
    assert all(s["t"] >= now - 100 for s in samples)
    assert samples[-1]["running"] == 119
    assert history.query("b", 0) == []
    history.close()


PAGE = """\
# TYPE tokenspeed:num_requests_running gauge
tokenspeed:num_requests_running{{model_name="m",dp_rank="0"}} 2
tokenspeed:num_requests_running{{model_name="m",dp_rank="1"}} 3
# TYPE tokenspeed:kv_cache_usage_perc gauge
tokenspeed:kv_cache_usage_perc{{model_name="m",dp_rank="0"}} 0.5
# TYPE tokenspeed:prefix_cache_hits counter
tokenspeed:prefix_cache_hits_total{{model_name="m",dp_rank="0"}} {hits}
# TYPE tokenspeed:prefix_cache_queries counter
tokenspeed:prefix_cache_queries_total{{model_name="m",dp_rank="0"}} {queries}
# TYPE tokenspeed:request_success counter
tokenspeed:request_success_total{{model_name="m",dp_rank="0",finished_reason="stop"}} {ok}
tokenspeed:request_success_total{{model_name="m",dp_rank="0",finished_reason="abort"}} 1
# TYPE tokenspeed:num_requests counter
tokenspeed:num_requests_total{{model_name="m",dp_rank="0"}} {ok}
# TYPE tokenspeed:time_to_first_token_seconds histogram
tokenspeed:time_to_first_token_seconds_bucket{{le="0.1",model_name="m",dp_rank="0"}} {b1}
tokenspeed:time_to_first_token_seconds_bucket{{le="0.2",model_name="m",dp_rank="0"}} {b2}
tokenspeed:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m",dp_rank="0"}} {b2}
tokenspeed:time_to_first_token_seconds_count{{model_name="m",dp_rank="0"}} {b2}
tokenspeed:time_to_first_token_seconds_sum{{model_name="m",dp_rank="0"}} 1.0
"""


def test_percentiles_come_from_bucket_deltas_over_the_window():
    old = metrics_math.parse(PAGE.format(hits=10, queries=100, ok=10, b1=100, b2=100), t=0.0)
    # In the window: 10 more observations, all between 0.1 and 0.2 s.
    new = metrics_math.parse(PAGE.format(hits=60, queries=200, ok=20, b1=100, b2=110), t=10.0)
    summary = metrics_math.summarize(new, old)
    assert summary["running"] == 5  # summed over DP ranks
    assert summary["kv_usage"] == 0.5
    assert summary["prefix_hit_rate"] == pytest.approx(0.5)  # 50 hits of 100 queries in the window
    assert summary["ttft_p50"] == pytest.approx(0.15)  # linear inside (0.1, 0.2]
    assert summary["ttft_p99"] == pytest.approx(0.199)
    assert summary["requests_total"] == 20 and summary["errors_total"] == 1
    # Without a window, the whole history counts: 100 of 110 under 0.1 s.
    assert metrics_math.summarize(new)["ttft_p50"] == pytest.approx(0.055)
    assert summary["queue_p50"] is None  # a server that does not export the queue-time histogram


def test_queue_time_percentiles_from_the_request_queue_histogram():
    def page(b1: int, b2: int) -> str:
        return (
            "# TYPE tokenspeed:request_queue_time_seconds histogram\n"
            f'tokenspeed:request_queue_time_seconds_bucket{{le="0.01",model_name="m",dp_rank="0"}} {b1}\n'
            f'tokenspeed:request_queue_time_seconds_bucket{{le="1.0",model_name="m",dp_rank="0"}} {b2}\n'
            f'tokenspeed:request_queue_time_seconds_bucket{{le="+Inf",model_name="m",dp_rank="0"}} {b2}\n'
            f'tokenspeed:request_queue_time_seconds_count{{model_name="m",dp_rank="0"}} {b2}\n'
            'tokenspeed:request_queue_time_seconds_sum{model_name="m",dp_rank="0"} 1.0\n'
        )

    old = metrics_math.parse(page(10, 10), t=0.0)
    new = metrics_math.parse(page(20, 30), t=10.0)  # in the window: 10 waits under 10 ms, 10 up to 1 s
    summary = metrics_math.summarize(new, old)
    assert summary["queue_p50"] == pytest.approx(0.01)
    assert summary["queue_p99"] == pytest.approx(0.01 + 0.98 * 0.99)


def test_quantile_edge_cases():
    assert metrics_math.quantile(0.5, {}) is None
    assert metrics_math.quantile(0.5, {0.1: 0, float("inf"): 0}) is None
    # Everything above the last finite bound: the bound is all that is known.
    assert metrics_math.quantile(0.99, {0.1: 0, 1.0: 0, float("inf"): 5}) == 1.0
    # A restarted server's counters went down: its new counts are the window.
    assert metrics_math.bucket_delta({0.1: 2, float("inf"): 3}, {0.1: 50, float("inf"): 60}) == {
        0.1: 2,
        float("inf"): 3,
    }
