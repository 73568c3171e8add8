"""Every kernel the engine launches has a row in a step's kernel profile (`benchmarks/kernel_profile.py`):
a Triton kernel left in `other` would hide where a step's time goes (the MoE layer's kernels once did)."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.kernel_profile import _group

ROOT = Path(__file__).resolve().parents[2]


def _launched_triton_kernels() -> set[str]:
    names = set()
    for path in (ROOT / "tokenspeed").rglob("*.py"):
        names.update(re.findall(r"@triton\.jit\s*(?:\([^)]*\))?\s*def (\w+_kernel)\(", path.read_text()))
    return names


def test_every_triton_kernel_has_a_group():
    kernels = _launched_triton_kernels()
    assert {"_dense_gemv_kernel", "_gate_up_kernel", "_decode_stage1_kernel", "_rmsnorm_kernel"} <= kernels
    assert not {k: _group(k) for k in kernels if _group(k) == "other"}


def test_the_groups_of_a_few_kernels():
    assert _group("_gate_up_silu_kernel") == _group("_sum_pairs_kernel") == "experts"
    assert _group("_dense_gemv_kernel") == _group("nvjet_tst_64x8_64x16_4x1_v_bz_TNT") == "matmul"
    assert _group("_decode_stage2_kernel") == "attention"
    assert _group("_sample_kernel") == "sampling"
