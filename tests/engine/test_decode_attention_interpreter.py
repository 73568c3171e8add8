"""The Triton decode attention, which every decode step on the GPU runs once a layer, checked on the CPU by
Triton's interpreter (`tests/engine/decode_attention_checks.py`) in float32 and float16 against PyTorch's
attention: in two launches (split, then merge) and in one (the last split of each request and kv head
merges), over GQA groups, ragged context lengths, empty splits and one split."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_one_launch_and_two_launch_decode_attention_match_pytorch():
    results = run_interpreted("tests.engine.decode_attention_checks")
    assert len(results) == 10
    for name, r in results.items():
        bound = 1e-5 if name.endswith("float32") else 1e-3  # float16 inputs: q, K and V rounded to 11 bits
        assert r["two_launch_error"] < bound, (name, r)
        assert r["one_launch_error"] < bound, (name, r)
        # the same partials merged by the same arithmetic, in one kernel or in a second
        assert r["modes_max_diff"] <= 1e-6, (name, r)
        # the next launch (a replayed CUDA graph) starts its counts from zero
        assert r["arrivals_zero"], (name, r)
