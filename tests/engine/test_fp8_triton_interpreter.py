"""The FP8 paths of the GPU kernels (block-scale GEMM, fused MoE with FP8 experts, attention over an FP8
KV cache) checked on the CPU by Triton's interpreter (`tests/engine/fp8_kernel_checks.py`)."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_fp8_kernel_paths_match_float32_references():
    errors = run_interpreted("tests.engine.fp8_kernel_checks")
    expected = {"block_gemm_64x256_m5", "block_gemm_200x300_m3", "decode_fp8_kv", "extend_fp8_kv"}
    expected |= {"extend_fresh_over_fp8_prefix"}
    expected |= {f"moe_{a}_{s}" for a in ("pairs", "grouped") for s in ("channel", "block16")}
    # the activations' FP8 quantization, per token and per (token, 128): quotients and scales bit-equal
    expected |= {f"quantize_rows_{d}_{k}" for d in ("bfloat16", "float16", "float32") for k in (300, 4096, 14336)}
    assert set(errors) == expected
    bad = {name: err for name, err in errors.items() if not err < 1e-5}
    assert not bad, bad
