"""The RoPE Triton kernels (plain, and fused with the KV-cache write) checked on the CPU by Triton's
interpreter (`tests/engine/rope_kernel_checks.py`): the same bits as the PyTorch rotation and as the two
launches the fused kernel replaces."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_rope_kernels_match_the_reference_bit_for_bit():
    results = run_interpreted("tests.engine.rope_kernel_checks")
    assert set(results) == {f"{dt}_d{d}" for dt in ("float32", "float16") for d in (16, 64)}
    wrong = {case: r for case, r in results.items() if r != {"apply_rope": True, "rope_store_kv": True}}
    assert not wrong, wrong
