"""The RoPE Triton kernels (plain, and fused with the KV-cache write) checked on the CPU by Triton's
interpreter (`tests/engine/rope_kernel_checks.py`): the same bits as the PyTorch rotation and as the two
launches the fused kernel replaces, and with Qwen3's q/k norms fused in, the PyTorch norm then rotation
within a rounding."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_rope_kernels_match_the_reference_bit_for_bit():
    results = run_interpreted("tests.engine.rope_kernel_checks")
    assert set(results) == {f"{dt}_d{d}" for dt in ("float32", "float16") for d in (16, 64)}
    everything = {"apply_rope": True, "rope_store_kv": True, "rope_store_kv_qk_norm": True}
    wrong = {case: r for case, r in results.items() if r != everything}
    assert not wrong, wrong
