"""RMSNorm (+ residual add) and SiLU-and-mul (`kernels/fused_ops.py`), run by Triton's interpreter on the CPU
(`TRITON_INTERPRET=1`, set by tests/engine/test_fused_ops_interpreter.py before Triton is imported): prints
one JSON object, per case, of each output's largest difference from the PyTorch reference it replaces,
relative to the reference's largest value.

- `rms_norm` against `RMSNorm._norm` (`layers/norm.py`), with and without a residual (whose sum must come
  back too), over a hidden size that fills its block and one that does not, and over the per-head shape
  of Qwen3's q/k norms;
- `silu_and_mul` against `F.silu(gate) * up` (`layers/activation.py`), over one column block and several,
  the last one ragged.

In float32, float16 and bfloat16. The interpreter truncates a cast to bfloat16 where the GPU rounds to
nearest, so bfloat16 is within one rounding, not bit for bit; tests/gpu/test_fused_ops.py checks the GPU's
code generation.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tokenspeed.runtime.kernels.fused_ops import rms_norm, silu_and_mul
from tokenspeed.runtime.layers.norm import RMSNorm

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    diff = (got.float() - want.float()).abs().max()
    return float(diff / want.float().abs().max().clamp_min(1e-30))


def check_rms_norm(dtype: torch.dtype, hidden: int) -> dict[str, float]:
    norm = RMSNorm(hidden, 1e-5).to(dtype)
    norm.weight.data = (torch.rand(hidden) + 0.5).to(dtype)
    x, r = torch.randn(5, hidden, dtype=dtype), torch.randn(5, hidden, dtype=dtype)
    y, res = rms_norm(x, norm.weight, norm.eps, r)
    heads = torch.randn(3, 4, hidden, dtype=dtype)
    return {
        "plain": _error(rms_norm(x, norm.weight, norm.eps), norm._norm(x)),
        "residual_sum": _error(res, x + r),
        "residual_norm": _error(y, norm._norm(x + r)),
        "per_head": _error(rms_norm(heads, norm.weight, norm.eps), norm._norm(heads)),
    }


def check_silu_and_mul(dtype: torch.dtype, n: int) -> float:
    x = torch.randn(3, 2 * n, dtype=dtype) * 3
    gate, up = x.chunk(2, dim=-1)
    return _error(silu_and_mul(x), F.silu(gate) * up)


def main() -> None:
    torch.manual_seed(0)
    out: dict[str, float] = {}
    for name, dtype in DTYPES.items():
        for hidden in (64, 1000):
            for what, err in check_rms_norm(dtype, hidden).items():
                out[f"rms_norm_{what}_{name}_h{hidden}"] = err
        for n in (100, 3000):  # one column block; two of 2048, the second ragged
            out[f"silu_and_mul_{name}_n{n}"] = check_silu_and_mul(dtype, n)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
