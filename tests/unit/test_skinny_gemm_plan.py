"""What `benchmarks/skinny_gemm.py` times and how it adds a decode step up: the skinny GEMM's candidate
configurations per shape and batch (`kernels/skinny_gemm.candidates`), and the step estimate that takes each
shape's faster path."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from benchmarks.skinny_gemm import step  # noqa: E402
from tokenspeed.runtime.kernels.skinny_gemm import SkinnyGemmConfig, candidates, shared_bytes  # noqa: E402

H200_SMS = 132


@pytest.mark.parametrize("m", [8, 16, 32, 64, 128])
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (2048, 4096)])
def test_candidates_fit_and_fill_the_gpu(m, n, k):
    cands = candidates(m, n, k, H200_SMS)
    assert cands and len(set(cands)) == len(cands)
    for c in cands:
        assert c.block_m >= max(16, m) or c.block_m == 128  # one M block holds the batch up to 128 rows
        assert shared_bytes(c) <= 160 << 10
        if m <= 32:
            assert c.swap_ab  # the batch alone would fill a quarter of Hopper's 64-row MMA
        elif m > 64:
            assert not c.swap_ab
        tiles = -(-n // c.block_n) * -(-m // c.block_m)
        if c.split_k > 1:
            # split only to fill the multiprocessors once, each part at least two K tiles
            assert tiles * (c.split_k // 2) < H200_SMS and k // (c.split_k * c.block_k) >= 2
            assert c.block_m * c.block_n <= 64 * 128
    # the 8B's o projection at 64 rows has 64 output tiles of 64: K is split to fill 132 multiprocessors
    if (m, n, k) == (64, 4096, 4096):
        assert any(c.split_k == 4 and c.block_n == 64 for c in cands)


def test_configs_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        SkinnyGemmConfig(block_n=96)
    with pytest.raises(ValueError, match="at least 16"):
        SkinnyGemmConfig(block_m=8)


def test_step_takes_each_shape_at_its_faster_path():
    rows = [
        dict(shape="o", m=64, path="cublas", us=10.0, weight_mb=32.0),
        dict(shape="o", m=64, path="skinny", us=8.0, weight_mb=32.0),
        dict(shape="down", m=64, path="cublas", us=30.0, weight_mb=117.0),
        dict(shape="down", m=64, path="skinny", us=31.0, weight_mb=117.0),
        dict(shape="down", m=16, path="cublas", us=29.0, weight_mb=117.0),
    ]
    shapes = {"o": (4096, 4096), "down": (4096, 14336)}
    got = step(rows, 64, shapes, layers=2)
    assert got["cublas"]["ms"] == 0.08  # (10 + 30) us x 2 layers
    assert got["faster"]["ms"] == 0.076  # (8 + 30) us x 2
    assert got["faster"]["skinny_shapes"] == ["o"]
    assert got["faster"]["tb_s"] == round(2 * 149e6 / 76 / 1e6, 3)
    assert step(rows, 16, shapes, layers=2) == {}  # o was not timed at 16 rows
