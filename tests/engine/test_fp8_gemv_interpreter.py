"""The FP8 GEMV that decode-sized FP8 linears take on CUDA, checked on the CPU by Triton's interpreter
(`tests/engine/fp8_gemv_checks.py`): per-channel and block-wise scales, odd N and K, M = 1, 3 and 16, every
configuration the autotuner may pick, the default entry point (`default_config`) and the autotuned one
(split-K chosen or not), against the float32 reference."""

from __future__ import annotations

import pytest

from tests.engine.interpreted import run_interpreted

pytest.importorskip("triton")


def test_fp8_gemv_configs_match_float32_reference():
    errors = run_interpreted("tests.engine.fp8_gemv_checks")
    layouts = ("channel", "block128", "block16x32")
    forced = {n for n in errors if not n.startswith(("autotuned_", "default_"))}
    assert {tuple(n.split("_")[:2]) for n in forced} == {(b, f"m{m}") for b in layouts for m in (1, 3, 16)}
    # every bucket has a choice to make, split-K configs included for M = 1
    assert all(int(name.split("_")[-1].removesuffix("configs")) >= 5 for name in errors if "fp32" in name)
    # the autotuned entry point picked the config its timing preferred, split-K or not, per layout
    defaults = {f"default_{b}_m{m}" for b in layouts for m in (1, 3, 16)}
    assert set(errors) - forced == {"autotuned_channel_split4", "autotuned_block128_split1"} | defaults
    # float32: the reference's own rounding; bf16: the output's rounding (2^-9 relative) and no more
    # (the default and autotuned entry points run float32 activations)
    exact = ("fp32", "default_", "autotuned_")
    bad = {n: e for n, e in errors.items() if not e < (1e-5 if any(t in n for t in exact) else 1e-2)}
    assert not bad, bad
