"""The FP8 GEMV that decode-sized FP8 linears take on CUDA, checked on the CPU by Triton's interpreter
(`tests/engine/fp8_gemv_checks.py`): per-channel and block-wise scales, odd N and K, M = 1, 3 and 16, every
configuration the autotuner may pick, against the float32 reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_fp8_gemv_configs_match_float32_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.engine.fp8_gemv_checks"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    cases = {(name.split("_")[0], name.split("_")[1]) for name in errors}
    assert cases == {(b, f"m{m}") for b in ("channel", "block128", "block16x32") for m in (1, 3, 16)}
    # every bucket has a choice to make, split-K configs included for M = 1
    assert all(int(name.split("_")[-1].removesuffix("configs")) >= 5 for name in errors if "fp32" in name)
    # float32: the reference's own rounding; bf16: the output's rounding (2^-9 relative) and no more
    bad = {n: e for n, e in errors.items() if not e < (1e-5 if "fp32" in n else 1e-2)}
    assert not bad, bad
