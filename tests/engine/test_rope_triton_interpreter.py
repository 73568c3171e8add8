"""The RoPE Triton kernels (plain, and fused with the KV-cache write) checked on the CPU by Triton's
interpreter (`tests/engine/rope_kernel_checks.py`): the same bits as the PyTorch rotation and as the two
launches the fused kernel replaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_rope_kernels_match_the_reference_bit_for_bit():
    # A process of its own: TRITON_INTERPRET is read when the kernels are defined, at import.
    proc = subprocess.run(
        [sys.executable, "-m", "tests.engine.rope_kernel_checks"],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {f"{dt}_d{d}" for dt in ("float32", "float16") for d in (16, 64)}
    wrong = {case: r for case, r in results.items() if r != {"apply_rope": True, "rope_store_kv": True}}
    assert not wrong, wrong
