"""The FP8 GEMV (`kernels/fp8_gemv.py`) run by Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, set by
tests/engine/test_fp8_gemv_interpreter.py before Triton is imported): every launch configuration the
autotuner may pick for a batch bucket and scale layout (split-K included), on odd N and K, against the
float32 reference of the dequantized weight, then the default entry point and the autotuned one. Prints one
JSON object: case -> worst relative error.

float32 activations check the indexing and scale arithmetic exactly (the IEEE dot path); bf16 activations
go through the CUDA-core path only, since the interpreter's bf16 `tl.dot` is not faithful (it returns
garbage for plain bf16 inputs). tests/gpu/test_fp8_gpu.py covers the GPU code generation.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tests.engine.gemv_autotune import prefer_split, tuned_then_cached
from tokenspeed.runtime.kernels import fp8_gemv
from tokenspeed.runtime.layers.quantization.fp8_math import dequantize, quantize_block, quantize_per_channel

# label -> (scale tiles, N, K): N is no multiple of the wider BLOCK_N; K = 300 leaves a tail in every K
# chunking (the masked loads), K = 512 none (the unmasked ones)
CASES = {"channel": (None, 40, 300), "block128": ((128, 128), 40, 512), "block16x32": ((16, 32), 40, 300)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def check() -> dict[str, float]:
    out = {}
    for label, (block, n, k) in CASES.items():
        w0 = torch.randn(n, k) * 0.05
        w, s = quantize_per_channel(w0) if block is None else quantize_block(w0, block)
        dense = dequantize(w, s, block, torch.float32)
        bias = torch.randn(n)
        for m in (1, 3, 16):
            x = torch.randn(m, k)
            ref = F.linear(x, dense, bias)
            configs = fp8_gemv.candidates(fp8_gemv.m_bucket(m), block[1] if block else None, True)
            worst = max(_rel(fp8_gemv.fp8_gemv(x, w, s, block, bias, cfg), ref) for cfg in configs)
            out[f"{label}_m{m}_fp32_{len(configs)}configs"] = worst
            if m < 16:
                xb = x.bfloat16()
                reduce = next(c for c in configs if not c.use_dot)
                got = fp8_gemv.fp8_gemv(xb, w, s, block, bias.bfloat16(), reduce)
                assert got.dtype == torch.bfloat16 and got.shape == (m, n)
                out[f"{label}_m{m}_bf16"] = _rel(got, F.linear(xb.float(), dense, bias.bfloat16().float()))
    return out


def defaults() -> dict[str, float]:
    """The entry point as `fp8_linear` calls it: `default_config` for the batch bucket and scale layout."""
    out = {}
    for label, (block, n, k) in CASES.items():
        w0 = torch.randn(n, k) * 0.05
        w, s = quantize_per_channel(w0) if block is None else quantize_block(w0, block)
        dense, bias = dequantize(w, s, block, torch.float32), torch.randn(n)
        for m in (1, 3, 16):
            x = torch.randn(m, k)
            out[f"default_{label}_m{m}"] = _rel(
                fp8_gemv.fp8_gemv(x, w, s, block, bias), F.linear(x, dense, bias)
            )
    return out


def autotuned() -> dict[str, float]:
    """The autotuned entry point the benchmark compares the default with (`gemv_autotune.py`)."""
    out = {}
    for label, want in (("channel", 4), ("block128", 1)):
        block, n, k = CASES[label]
        ran = prefer_split(fp8_gemv, fp8_gemv.ALL_CONFIGS, ["N", "K", "M_BUCKET", "GK", "GN"], want)
        w0 = torch.randn(n, k) * 0.05
        w, s = quantize_per_channel(w0) if block is None else quantize_block(w0, block)
        x, bias = torch.randn(1, k), torch.randn(n)
        ref = F.linear(x, dequantize(w, s, block, torch.float32), bias)
        args = (x, w, s, block, bias, None, True)  # autotune=True
        first, again = tuned_then_cached(fp8_gemv, want, ran, fp8_gemv.fp8_gemv, *args)
        out[f"autotuned_{label}_split{want}"] = max(_rel(first, ref), _rel(again, ref))
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps({**check(), **defaults(), **autotuned()}))
