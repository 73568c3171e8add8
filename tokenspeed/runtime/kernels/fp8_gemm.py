"""FP8 GEMMs on CUDA: y = x W^T with W in e4m3 and float32 scales.

- decode-sized batches (M <= `fp8_gemv.GEMV_MAX_M`): the Triton FP8 GEMV of `kernels/fp8_gemv.py`, one
  pass over the weight with the activations unquantized, whatever the scale layout; larger batches
  quantize the activations per token and go through:
- per-channel weights (`weight_scale` [N, 1]): `torch._scaled_mm` with rowwise scales (x per token [M, 1],
  quantized in one launch by `kernels/fp8_quant.py`; W per channel [1, N]), bf16 out; where the shapes or dtypes do not allow it (fp16 activations, K or N not
  a multiple of 16) the weight is dequantized and multiplied in the activations' dtype;
- block-wise weights (`weight_scale` [ceil(N/bn), ceil(K/bk)]): a Triton GEMM over K tiles of `bk`, with
  activations quantized per (token, bk group), both scales applied to each tile's partial product.

Imported only when an FP8 layer runs on a CUDA tensor (`layers/quantization/fp8.py`), so CPU-only
machines never import Triton from here. tests/gpu/test_fp8_gpu.py checks both
paths against the float32 reference on the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import fp8_gemv
from tokenspeed.runtime.kernels.fp8_quant import quantize_rows
from tokenspeed.runtime.layers.quantization.fp8_math import dequantize


def _scaled_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    n, k = w.shape
    return x.dtype == torch.bfloat16 and k % 16 == 0 and n % 16 == 0


@triton.jit
def _block_fp8_kernel(
    A, B, C, As, Bs, M, N, K,
    stride_am, stride_bn, stride_cm, stride_as, stride_bs,
    GN: tl.constexpr, GK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, GK)
    mmask = offs_m < M
    nmask = offs_n < N
    a_ptr = A + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptr = B + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    as_ptr = As + offs_m.to(tl.int64) * stride_as
    bs_ptr = Bs + (offs_n // GN).to(tl.int64) * stride_bs
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, GK)):
        kmask = offs_k + kb * GK < K
        a = tl.load(a_ptr, mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptr, mask=nmask[None, :] & kmask[:, None], other=0.0)
        a_s = tl.load(as_ptr + kb, mask=mmask, other=0.0)
        b_s = tl.load(bs_ptr + kb, mask=nmask, other=0.0)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptr += GK
        b_ptr += GK
    out = C + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(out, acc.to(C.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def block_fp8_matmul(
    x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """x [M, K] (bf16/fp16) times block-quantized w [N, K] -> [M, N] in x's dtype."""
    bn, bk = block
    m, k = x.shape
    n = w.shape[0]
    if bk < 16 or bk & (bk - 1):
        # tl.dot wants a power-of-two K tile of at least 16; other tiles take the reference path.
        return F.linear(x, dequantize(w, w_scale, block, x.dtype))
    q, xs = quantize_rows(x, group=bk)  # per (token, bk group) activation scales, one launch
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 64
    block_n = 128 if bn >= 128 else max(16, bn)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _block_fp8_kernel[grid](
        q, w, out, xs, w_scale, m, n, k,
        q.stride(0), w.stride(0), out.stride(0), xs.stride(0), w_scale.stride(0),
        GN=bn, GK=bk, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=3,
    )  # fmt: skip
    return out


def fp8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int] | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if fp8_gemv.supported(x2, w, w_scale, block):
        # decode-sized batches: one pass over the weight, activations as they are (no quantize kernels)
        y = fp8_gemv.fp8_gemv(x2, w, w_scale, block, bias)
    elif block is not None:
        y = block_fp8_matmul(x2, w, w_scale, block)
        if bias is not None:
            y = y + bias
    elif _scaled_mm_ok(x2, w) and x2.shape[0] > 0:
        q, xs = quantize_rows(x2)  # per token: [M, 1], one launch (`fp8_quant.py`)
        y = torch._scaled_mm(q, w.t(), scale_a=xs, scale_b=w_scale.view(1, -1), bias=bias, out_dtype=x.dtype)
    else:
        y = F.linear(x2, dequantize(w, w_scale, None, x.dtype), bias)
    return y.reshape(*shape[:-1], w.shape[0])
