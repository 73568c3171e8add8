"""The expert recorder's session against the window that --enable-eplb / expert metrics keep counting,
and the summaries a rebalance reports."""

from __future__ import annotations

import torch

from tokenspeed.config.slices import ExpertPlan
from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.eplb_manager import moved_experts, replica_summary


def step(rec: ExpertDistributionRecorder, experts: list[int]) -> None:
    rec.record(0, torch.tensor([experts]))
    rec.end_pass()


def test_stop_of_a_kept_recorder_freezes_the_dump_and_keeps_counting():
    rec = ExpertDistributionRecorder(
        "per_pass", 1, 4, kept_by=ExpertPlan(enable_eplb=True).kept_by
    )
    assert rec.recording and rec.state.kept_by == "--enable-eplb needs the expert load"
    rec.start()
    step(rec, [0, 1])
    step(rec, [0, 2])
    rec.stop()
    assert rec.recording  # EPLB still reads the load
    step(rec, [3, 3])
    assert rec.window_counts().tolist() == [[2, 1, 1, 2]]
    dump = rec.dump()
    assert dump["logical_count"].tolist() == [[2, 1, 1, 0]] and dump["passes"] == 2
    assert len(dump["per_pass"]) == 2
    rec.reset()  # a rebalance restarts the window; the stopped session's dump stays
    assert rec.dump()["logical_count"].tolist() == [[2, 1, 1, 0]]
    rec.start()
    step(rec, [1, 1])
    assert rec.dump()["logical_count"].tolist() == [[0, 2, 0, 0]]


def test_stop_of_a_session_only_recorder_stops_counting():
    rec = ExpertDistributionRecorder("stat", 1, 4)
    assert ExpertPlan(enable_eplb=False).kept_by is None
    assert not rec.recording
    rec.start()
    step(rec, [0, 1])
    rec.stop()
    assert not rec.recording
    step(rec, [2, 2])
    assert rec.window_counts().tolist() == [[1, 1, 0, 0]]


def test_rebalance_summaries():
    old = torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1]])
    new = torch.tensor([[0, 1, 2, 3, 0, 1], [2, 1, 0, 3, 2, 2]])
    assert moved_experts(old, new, [0, 1]) == [[], [0, 2]]
    logcnt = torch.tensor([[2, 2, 1, 1], [1, 1, 3, 1]])
    assert replica_summary(logcnt, [0, 1]) == [[[0, 2], [1, 2]], [[2, 3]]]
