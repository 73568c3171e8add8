"""The skinny tensor-core GEMM for decode batches of 8-128 rows, checked on the CPU by Triton's interpreter
(`tests/engine/skinny_gemm_checks.py`) in float32 and float16 against a float32 reference: unsplit and with K
split over programs whose last arrival adds the partials, the operands swapped or not, ragged rows, outputs
and K."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_skinny_gemm_matches_the_reference_split_or_not():
    results = run_interpreted("tests.engine.skinny_gemm_checks")
    assert len(results) == 14
    for name, r in results.items():
        # float16 inputs are rounded to 11 bits before the float32 products; float32 multiplies exactly
        assert r["error"] < (1e-5 if name.endswith("float32") else 2e-3), (name, r)
        assert r["repeat_equal"], (name, r)  # the partials are added in split order every launch
        assert r["arrivals_zero"], (name, r)  # the next launch (a replayed graph) starts from zero
