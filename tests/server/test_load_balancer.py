"""The DP controller's choice of group, from stats snapshots and its own recent dispatches."""

from __future__ import annotations

import pytest

from tokenspeed.runtime.engine.data_parallel_controller import LoadBalancer
from tokenspeed.runtime.engine.io_struct import StatsSnapshot


def snap(rank: int, running: int = 0, waiting: int = 0, used: int = 0, total: int = 100) -> StatsSnapshot:
    return StatsSnapshot(dp_rank=rank, num_running=running, num_waiting=waiting, kv_pages_used=used,
                         kv_pages_total=total, block_size=16)  # fmt: skip


def test_round_robin_cycles():
    lb = LoadBalancer("round_robin", 3)
    assert [lb.pick(10) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_shortest_queue_follows_snapshots_and_spreads_a_burst():
    lb = LoadBalancer("shortest_queue", 2)
    lb.observe(snap(0, running=5, waiting=3))
    lb.observe(snap(1, running=1))
    assert lb.pick(10) == 1
    # A burst within one snapshot interval: dispatches are counted, so the queues even out instead of
    # every request piling onto the group that looked shortest.
    picks = [lb.pick(10) for _ in range(12)]
    assert picks.count(0) > 0
    assert abs((8 + picks.count(0)) - (1 + 1 + picks.count(1))) <= 1
    # A fresh snapshot replaces the guesswork.
    lb.observe(snap(0, running=0))
    lb.observe(snap(1, running=20))
    assert lb.pick(10) == 0


def test_minimum_cache_usage_counts_pending_prompt_tokens():
    lb = LoadBalancer("minimum_cache_usage", 2)
    lb.observe(snap(0, used=50))
    lb.observe(snap(1, used=10))
    assert lb.pick(16) == 1
    # 1600 tokens = 100 pages at 16 tokens a page: group 1 is now "full" until its next snapshot.
    assert lb.pick(1600) == 1
    assert lb.pick(16) == 0


def test_unknown_method_names_the_flag():
    with pytest.raises(ValueError, match="--load-balance-method"):
        LoadBalancer("fastest", 2)
