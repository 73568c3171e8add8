"""The dense GEMV that bf16/fp16 linears and the LM head take for decode batches of 1-4 rows on CUDA, checked
on the CPU by Triton's interpreter (`tests/engine/bf16_gemv_checks.py`): every launch configuration, split-K
or not (split-K merged by its last arrival), at M = 1..4, on ragged and unmasked N and K edges, and the
autotuned entry point choosing split-K or not, against the float32 reference."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_bf16_gemv_configs_match_float32_reference():
    errors = run_interpreted("tests.engine.bf16_gemv_checks", timeout=900.0)
    exact = {n: e for n, e in errors.items() if "_fp32_" in n}
    cast = {n: e for n, e in errors.items() if "_out16_" in n}
    assert {n.split("_fp32")[0] for n in exact} == {
        *(f"ragged_m{m}" for m in (1, 2, 3, 4)),
        *(f"even_m{m}" for m in (1, 2, 4)),
        "fp16_m3",
    }
    # every batch bucket has configs to choose from, split-K ones among them; fewer for 4 rows (registers)
    for name in exact:
        configs, splits = name.split("_")[-2:]
        if not name.startswith("fp16"):
            m = int(name.split("_")[1].removeprefix("m"))
            assert int(configs.removesuffix("configs")) >= (14 if m <= 2 else 10), name
            assert int(splits.removesuffix("split")) >= 3, name
    # float32 out: the reference's own rounding; 16-bit out: the cast (the interpreter truncates bf16)
    bad = {n: e for n, e in exact.items() if not e < 1e-5}
    bad |= {n: e for n, e in cast.items() if not e < 1e-2}
    assert not bad, bad
    # split-K merged in the launch by its last arrival: the same bits twice, the counts back at zero
    arrive = {n: e for n, e in errors.items() if "_arrive_" in n}
    assert len(arrive) == 2 * 8 and all(e == 0.0 for e in arrive.values()), arrive
    # the autotuned entry point picked the config its timing preferred, split-K or not
    assert errors["autotuned_split4"] < 1e-5 and errors["autotuned_split1"] < 1e-5
