"""The dense GEMV (`kernels/bf16_gemv.py`) run by Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, set
by tests/engine/test_bf16_gemv_interpreter.py before Triton is imported): every launch configuration, split-K
or not, for batches of 1-4 rows, on ragged N and K and on edges that need no mask, against the float32
reference. Prints one JSON object: case -> worst relative error.

A float32 output checks the indexing exactly (products of bf16 values are exact in float32); a bf16 output
checks the cast, which the interpreter truncates where the GPU rounds (hence its looser bound in the test).
Split-K launches merge their partials in the launch (the last split to arrive adds them): the same bits
twice, the arrival counts left at zero. Then the autotuned entry point as `layers/dense_gemv.py` calls it
(pruning, the config cache), with a timing function that prefers a given SPLIT_K: the CPU cannot time GPU
kernels, everything else is real.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tests.engine.gemv_autotune import prefer_split, tuned_then_cached
from tokenspeed.runtime.kernels import bf16_gemv

# label -> (N, K, dtype, batch sizes): N = 37 is no multiple of any BLOCK_N and K = 300 leaves a tail in every
# K chunking (masked loads), shorter than one 512-wide chunk; 16 x 1024 needs no mask at all and has several
# chunks per split for the prefetch; fp16 weights take the same kernel.
CASES = {
    "ragged": (37, 300, torch.bfloat16, (1, 2, 3, 4)),
    "even": (16, 1024, torch.bfloat16, (1, 2, 4)),
    "fp16": (40, 1100, torch.float16, (3,)),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def check() -> dict[str, float]:
    out = {}
    for label, (n, k, dtype, batches) in CASES.items():
        w = (torch.randn(n, k) * 0.05).to(dtype)
        bias = torch.randn(n).to(dtype)
        for m in batches:
            x = torch.randn(m, k).to(dtype)
            ref = F.linear(x.float(), w.float(), bias.float())
            configs = bf16_gemv.candidates(bf16_gemv.m_bucket(m), True)
            if label == "fp16":
                configs = configs[:1] + [c for c in configs if c.split_k > 1][:1]
            exact = {cfg: _rel(bf16_gemv.dense_gemv(x, w, bias, torch.float32, cfg), ref) for cfg in configs}
            splits = sum(c.split_k > 1 for c in exact)
            out[f"{label}_m{m}_fp32_{len(configs)}configs_{splits}split"] = max(exact.values())
            # the cast to the activations' dtype, without and with split-K (the same epilogue in every config)
            for cfg in (configs[0], next(c for c in configs if c.split_k > 1)):
                got = bf16_gemv.dense_gemv(x, w, bias, None, cfg)
                assert got.dtype == dtype and got.shape == (m, n)
                out[f"{label}_m{m}_out16_split{cfg.split_k}"] = _rel(got, ref)
            # split-K merged by the last split to arrive, counting in the caller's buffer: the same bits
            # twice, the counts left at zero
            split = next(c for c in configs if c.split_k > 1)
            arrivals = torch.zeros(bf16_gemv.arrival_tiles(n, x.device, split) + 3, dtype=torch.int32)
            twice = [bf16_gemv.dense_gemv(x, w, bias, torch.float32, split, arrivals) for _ in range(2)]
            out[f"{label}_m{m}_arrive_repeat_differs"] = float((twice[0] != twice[1]).sum())
            out[f"{label}_m{m}_arrive_counts_left"] = float(arrivals.abs().sum())
    return out


def autotuned() -> dict[str, float]:
    out = {}
    for want in (4, 1):
        n, k, dtype, _ = CASES["even"]
        ran = prefer_split(bf16_gemv, bf16_gemv.CONFIGS, ["N", "K", "BLOCK_M", "HAS_BIAS"], want)
        w = (torch.randn(n, k) * 0.05).to(dtype)
        x = torch.randn(1, k).to(dtype)
        ref = F.linear(x.float(), w.float())
        first, again = tuned_then_cached(
            bf16_gemv, want, ran, bf16_gemv.dense_gemv, x, w, None, torch.float32
        )
        out[f"autotuned_split{want}"] = max(_rel(first, ref), _rel(again, ref))
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps({**check(), **autotuned()}))
