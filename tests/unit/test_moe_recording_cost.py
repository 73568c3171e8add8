"""The decode benchmark's expert-recording cost (`benchmarks/moe_bench.recording_cost`): recording on vs off
at the same batch of the same run, from graph-replay rows only."""

from __future__ import annotations

from benchmarks.moe_bench import recording_cost


def _row(cfg, batch, step_ms, **kw):
    return dict(backend="triton", context=1024, batch=batch, moe_config=cfg, step_ms=step_ms, **kw)


def test_recording_cost_pairs_rows_of_the_same_batch():
    rows = [
        _row("default", 1, 3.0),
        _row("default", 64, 10.0),
        _row("record", 1, 3.15),
        _row("record", 64, 10.2),
        _row("default", 16, 5.0),  # no recording row at this batch: no cost
        _row("record", 1, 9.0, eager=True),  # eager steps are not what serving replays
        _row("eplb", 1, 4.0),  # another configuration
        dict(backend="triton", context=1024, batch=256, moe_config="record", skipped="out of memory"),
    ]
    assert recording_cost(rows) == {"triton/1024/1": 0.05, "triton/1024/64": 0.02}
    assert recording_cost([]) == {}
