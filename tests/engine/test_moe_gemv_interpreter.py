"""The MoE GEMV of few-token decode steps (`moe/kernels/gemv.py`), checked on the CPU by Triton's
interpreter (`tests/engine/moe_gemv_checks.py`) against the float32 reference loop: 1-4 tokens, top-2 and
top-8, remote experts, odd sizes, every prefetch depth, the down kernel split over pairs or not, FP8, the
split down kernel and the gate/up kernel split over K merged by their last arrival, and the routing
computed in its first launch."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_moe_gemv_matches_float32_reference():
    errors = run_interpreted("tests.engine.moe_gemv_checks", timeout=900.0)
    routed = {n: e for n, e in errors.items() if n.startswith("routed_")}
    arrive = {n: e for n, e in errors.items() if n.startswith("arrive_")}
    errors = {n: e for n, e in errors.items() if n not in routed and n not in arrive}
    rel = {n: e for n, e in errors.items() if not n.endswith("_remote_token_max")}
    # every token count with both top-k, each launch configuration at least twice, FP8 both ways
    assert {n.split("_")[0] for n in rel if n.startswith("t")} == {"t1", "t2", "t3", "t4"}
    assert {n.split("_")[1] for n in rel if n.startswith("t")} == {"k2", "k8"}
    assert {n.rsplit("_", 1)[1] for n in rel} == {"p1", "p2split", "p0h1", "gus4", "gus2ds2"}
    assert {"fp8_channel_p1", "fp8_block16_p2split", "fp8_block16_gus2ds2"} <= set(rel)
    bad = {n: e for n, e in rel.items() if not e < 1e-5}
    assert not bad, bad
    # a token whose k experts are all on other ranks gets exactly zero
    remote = {n: v for n, v in errors.items() if n.endswith("_remote_token_max")}
    assert remote and all(v == 0.0 for v in remote.values()), remote
    # the routing taken into the first launch chooses what the routing kernel chooses, ties included, and
    # counts the same choices (the padding row's not at all)
    assert len(routed) == 16, routed
    for name, value in routed.items():
        bound = 1e-5 if name.endswith("_error") else 1e-6 if name.endswith("_weight_max_diff") else 0.0
        assert value <= bound, (name, value)
    # the splits merged by their last arrival (down over pairs, gate/up over K): as exact, the same bits
    # twice, the counts back at 0
    assert len(arrive) == 15, arrive
    for name, value in arrive.items():
        exact = name.endswith(("_repeat_differs", "_arrivals_left"))
        assert value <= (0.0 if exact else 1e-5), (name, value)
