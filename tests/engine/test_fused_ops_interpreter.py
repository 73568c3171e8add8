"""The RMSNorm and SiLU-and-mul Triton kernels, which every decode step on the GPU runs once or twice a layer,
checked on the CPU by Triton's interpreter (`tests/engine/fused_ops_checks.py`) in float32, float16 and
bfloat16 against the PyTorch paths they replace."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_rms_norm_and_silu_and_mul_match_pytorch_in_every_dtype():
    errors = run_interpreted("tests.engine.fused_ops_checks")
    dtypes = ("float32", "float16", "bfloat16")
    norm_parts = ("plain", "residual_sum", "residual_norm", "per_head")
    assert set(errors) == {
        *(f"rms_norm_{p}_{d}_h{h}" for p in norm_parts for d in dtypes for h in (64, 1000)),
        *(f"silu_and_mul_{d}_n{n}" for d in dtypes for n in (100, 3000)),
    }
    # float32: the kernels sum squares and take exp / rsqrt their own way, a few last bits apart at most
    # float16 rounds like PyTorch; the interpreter casts to bfloat16 by truncation (up to 2^-7 each time),
    # and RMSNorm casts twice (the normed row, then its product with the weight). A wrong weight, eps or
    # index is off by tenths; the bf16 arithmetic Triton's interpreter gets wrong gave NaN and 1e36.
    bounds = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 2e-2}
    bad = {n: e for n, e in errors.items() if not e <= bounds[next(d for d in dtypes if f"_{d}" in n)]}
    assert not bad, bad
    # the residual's sum is one rounded add, computed as PyTorch computes it
    assert errors["rms_norm_residual_sum_float32_h64"] == errors["rms_norm_residual_sum_float16_h1000"] == 0.0
