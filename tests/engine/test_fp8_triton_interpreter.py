"""The FP8 paths of the GPU kernels (block-scale GEMM, fused MoE with FP8 experts, attention over an FP8
KV cache) checked on the CPU by Triton's interpreter (`tests/engine/fp8_kernel_checks.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_fp8_kernel_paths_match_float32_references():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.engine.fp8_kernel_checks"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {"block_gemm_64x256_m5", "block_gemm_200x300_m3", "decode_fp8_kv", "extend_fp8_kv"}
    expected |= {f"moe_{a}_{s}" for a in ("pairs", "grouped") for s in ("channel", "block16")}
    assert set(errors) == expected
    bad = {name: err for name, err in errors.items() if not err < 1e-5}
    assert not bad, bad
