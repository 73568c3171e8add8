"""The skinny tensor-core GEMM (`kernels/skinny_gemm.py`) run by Triton's interpreter on the CPU
(`TRITON_INTERPRET=1`, set by tests/engine/test_skinny_gemm_interpreter.py): prints one JSON object with, per
case, the relative error against a float32 reference, whether a second launch gave the same bits (a split-K
launch starts from the arrival counts the first left), and whether those counts are back at zero.

The interpreter runs a grid's programs one after another, so here the last split to arrive is always the
last one; on the GPU any may be, and the sum is taken in split order all the same.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tokenspeed.runtime.kernels.skinny_gemm import SkinnyGemmConfig, skinny_gemm, tiles

# (name, M, N, K, config): block_m, block_n, block_k, split_k, num_warps, num_stages, swap_ab
CASES = (
    ("m16_unsplit", 16, 96, 256, SkinnyGemmConfig(16, 32, 64, 1, 4, 1)),
    ("m5_ragged_n", 5, 70, 128, SkinnyGemmConfig(16, 32, 64, 1, 4, 1)),  # padded rows and outputs
    ("m24_two_m_blocks_split2", 24, 64, 512, SkinnyGemmConfig(16, 32, 64, 2, 4, 1)),
    ("m16_split4", 16, 48, 512, SkinnyGemmConfig(16, 16, 64, 4, 4, 1)),
    # K not a multiple of the split
    ("m9_uneven_k_split4", 9, 40, 300, SkinnyGemmConfig(16, 16, 32, 4, 4, 1)),
    ("swapped_m12", 12, 80, 256, SkinnyGemmConfig(16, 64, 64, 1, 4, 1, swap_ab=True)),
    ("swapped_m40_split2", 40, 100, 384, SkinnyGemmConfig(32, 64, 64, 2, 4, 1, swap_ab=True)),
)


def run() -> dict[str, dict[str, float | bool]]:
    out = {}
    for dtype in (torch.float32, torch.float16):
        for name, m, n, k, cfg in CASES:
            gen = torch.Generator().manual_seed(m * 100 + n + k)
            x = torch.randn(m, k, generator=gen).to(dtype)
            w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
            ref = F.linear(x.float(), w.float())
            arrivals = torch.zeros(tiles(m, n, cfg) + 2, dtype=torch.int32)
            first = skinny_gemm(x, w, cfg, arrivals)
            second = skinny_gemm(x, w, cfg, arrivals)
            out[f"{name}_{str(dtype).removeprefix('torch.')}"] = {
                "error": float((first.float() - ref).norm() / ref.norm()),
                "repeat_equal": bool(torch.equal(first, second)),
                "arrivals_zero": bool((arrivals == 0).all()),
            }
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
