"""The Triton sampling kernel checked on the CPU by Triton's interpreter (`tests/engine/sampling_kernel_checks.py`):
greedy and top-k 1 rows take the argmax, every draw obeys its row's top-k, top-p and min-p, and a seed
fixes the draw."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_sampling_kernel_draws_obey_each_rows_settings():
    results = run_interpreted("tests.engine.sampling_kernel_checks")
    assert results == {
        "greedy_is_argmax": True,
        "top_k_1_is_argmax": True,
        "draws_obey_top_k_top_p_min_p": True,
        "same_seed_same_tokens": True,
        "seeds_vary_the_draws": True,
    }
