"""Per-token FP8 quantization of activations in one launch: x [M, K] -> (e4m3 [M, K], float32 scales [M, 1]).

A batch too large for the FP8 GEMV (`fp8_gemv.GEMV_MAX_M`) multiplies per-channel FP8 weights with
`torch._scaled_mm`, which wants the activations in e4m3 with a scale per token. In PyTorch that
quantization (`fp8_math.quantize_per_channel`: abs, amax, cast, divide, clamp, then the same again over the
row) is about nine kernels per linear layer, over a thousand a decode step of Llama-3.1-8B; on the H200 they
took 2.90 ms of a batch-64 step's 14.73 ms of kernel time (`gpu_decode_fp8_weights.json`, docs/GPU.md). Here one program per row finds the row's largest
magnitude, then writes the quantized row and its scale. The block-wise GEMM's activations, a scale per
(token, group of K columns), take the same kernel with one program per group.

Every operation is the reference's, in the same order and precision (float32 division rounded to nearest,
`div_rn`; the clamp to e4m3's finite range before the round-to-nearest-even cast), so the bits equal
`quantize_per_channel`'s as the CPU computes them: tests/engine/fp8_kernel_checks.py compares them in
Triton's interpreter, tests/gpu/test_fp8_gpu.py on the GPU. (On the GPU PyTorch's `amax / 448` multiplies
by the float32 reciprocal instead, so the unfused path's scales may differ from these in the last bit.)
Imported only where an FP8 layer runs on a CUDA tensor (`kernels/fp8_gemm.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.layers.quantization.fp8_math import FP8_DTYPE, FP8_MAX, MIN_SCALE

# Elements a program holds per step of its two passes over a row (16 per thread at 4 warps).
BLOCK = 2048


@triton.jit
def _quantize_rows_kernel(X, Q, S, K, GROUP, stride_x, stride_q, stride_s, FMAX: tl.constexpr, MIN_S: tl.constexpr,
                          BLOCK: tl.constexpr):  # fmt: skip
    """Program (row, group): elements [g * GROUP, (g + 1) * GROUP) of the row over their own scale."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    lo = g * GROUP
    hi = tl.minimum(lo + GROUP, K)
    x_row = X + row * stride_x
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(lo, hi, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < hi, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), FMAX), MIN_S)
    tl.store(S + row * stride_s + g, scale)
    q_row = Q + row * stride_q
    for k0 in range(lo, hi, BLOCK):  # the second pass reads the group back from the L2 cache
        offs = k0 + tl.arange(0, BLOCK)
        mask = offs < hi
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FMAX), FMAX)
        tl.store(q_row + offs, q.to(Q.dtype.element_ty), mask=mask)


def quantize_rows(
    x: torch.Tensor, group: int | None = None, dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (bf16/fp16/fp32) -> (e4m3 [M, K], float32 scales): per token, [M, 1], as
    `fp8_math.quantize_per_channel(x)` computes them; with `group`, per (token, `group` columns),
    [M, ceil(K / group)], as `fp8_math.quantize_block(x, (1, group))` does (the block-wise GEMM's
    activations). `dtype` float32 stores the clamped quotients before the e4m3 cast: Triton's CPU
    interpreter rounds some casts wrongly (124.3 to 64, not 128), so the CPU check compares those and
    tests/gpu/test_fp8_gpu.py the cast."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    group = k if group is None else group
    groups = -(-k // group) if k else 0
    q = torch.empty((m, k), dtype=dtype, device=x.device)
    scale = torch.empty((m, max(groups, 1)), dtype=torch.float32, device=x.device)
    if m and groups:
        block = min(BLOCK, triton.next_power_of_2(group))
        _quantize_rows_kernel[(m, groups)](
            x, q, scale, k, group, x.stride(0), q.stride(0), scale.stride(0), FMAX=FP8_MAX, MIN_S=MIN_SCALE,
            BLOCK=block, num_warps=4,
        )  # fmt: skip
    return q, scale
