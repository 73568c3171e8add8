"""Fused elementwise kernels of the decoder layer: RMSNorm (+ residual add), SiLU-and-mul, RoPE.

In PyTorch each of these is 3-10 small kernels (casts, pow, mean, rsqrt, chunk, mul, add); a decode step of
a 32-layer model then spends more time launching kernels than reading weights. Each function here is one
launch. Every intermediate is rounded to the activation dtype at the same points as the PyTorch reference
(`layers/norm.py`, `layers/activation.py`, `layers/rotary.py`), so fused and reference results agree
within float32's last bits (the kernels sum squares and take exp/rsqrt their own way) and within one
rounding in bfloat16.

Arithmetic between two 16-bit values (the residual add, the norm's weight, SiLU's product with up) is
written in float32 and rounded once: a sum or product of two bf16 or fp16 values taken in float32 rounds
to the same bits as a native 16-bit operation (Triton 3.6 compiles both spellings to the same
sm_90 PTX, instruction for instruction), so the GPU's results are unchanged, and Triton's
interpreter, which computes bf16 arithmetic wrongly (1.5 x 2.0 = 0 in Triton 3.9), checks the kernels in
bf16 on the CPU (`tests/engine/fused_ops_checks.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.kernels import pdl


@triton.jit
def _rmsnorm_kernel(
    X,
    R,
    W,
    Y,
    RO,
    stride_x,
    stride_r,
    stride_y,
    stride_ro,
    N,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # Under PDL (kernels/pdl.py) the next kernel, a GEMV, may start loading its weights while this one runs.
    pdl.release(PDL)
    pdl.wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(RO + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)
    y = (xf * inv).to(X.dtype.element_ty).to(Y.dtype.element_ty)
    w = tl.load(W + offs, mask=mask, other=0.0).to(Y.dtype.element_ty)
    tl.store(
        Y + row * stride_y + offs, (y.to(tl.float32) * w.to(tl.float32)).to(Y.dtype.element_ty), mask=mask
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """norm(x), or (norm(x + residual), x + residual); x of any shape whose last dim is the norm's."""
    shape = x.shape
    n = shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    y = torch.empty((x2.shape[0], n), dtype=out_dtype, device=x.device)
    block = triton.next_power_of_2(n)
    warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    has_res = residual is not None
    r2, new_res = x2, y  # without a residual, R and RO are neither read nor written
    if has_res:
        r2 = residual.reshape(-1, n)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        new_res = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(x2.shape[0],)](
        x2, r2, weight, y, new_res,
        x2.stride(0), r2.stride(0) if has_res else 0, y.stride(0), new_res.stride(0) if has_res else 0,
        n, eps, HAS_RES=has_res, BLOCK=block, num_warps=warps, **pdl.launch_kwargs(x.device),
    )  # fmt: skip
    if not has_res:
        return y.view(shape)
    return y.view(shape), new_res.view(shape)


@triton.jit
def _silu_mul_kernel(X, Y, stride_x, stride_y, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.release(PDL)  # the down projection's GEMV may start loading its weights
    pdl.wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(X + row * stride_x + N + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(X.dtype.element_ty)
    tl.store(
        Y + row * stride_y + offs, (act.to(tl.float32) * up.to(tl.float32)).to(Y.dtype.element_ty), mask=mask
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :n]) * x[..., n:] for x [..., 2n]."""
    shape = x.shape
    n = shape[-1] // 2
    x2 = x.reshape(-1, 2 * n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(2048, triton.next_power_of_2(n))
    _silu_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](
        x2, y, x2.stride(0), y.stride(0), n, BLOCK=block, num_warps=4, **pdl.launch_kwargs(x.device)
    )
    return y.view(*shape[:-1], n)


@triton.jit
def rotate_head(src, cs, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """Neox-style rotation of the head at `src` by its token's cos|sin row at `cs`: its two halves, in the
    head's dtype. Shared by every RoPE kernel, so they all round alike."""
    x1, x2 = load_halves(src, HALF, BLOCK)
    return rotate_halves(x1, x2, cs, HALF, BLOCK)


@triton.jit
def load_halves(src, HALF: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    return tl.load(src + offs, mask=mask, other=0.0), tl.load(src + HALF + offs, mask=mask, other=0.0)


@triton.jit
def rotate_halves(x1, x2, cs, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """The rotation of a head held as its two halves (in the head's dtype) by the cos|sin row at `cs`."""
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    cos1 = tl.load(cs + offs, mask=mask, other=0.0)
    cos2 = tl.load(cs + HALF + offs, mask=mask, other=0.0)
    sin1 = tl.load(cs + 2 * HALF + offs, mask=mask, other=0.0)
    sin2 = tl.load(cs + 3 * HALF + offs, mask=mask, other=0.0)
    dt = x1.dtype
    # q * cos + rotate_half(q) * sin, rotate_half(q) = [-x2, x1], rounded where the reference rounds. Triton
    # contracts a product and a sum into one FMA unless told not to: on sm_90 Triton 3.6 made one product
    # and the sum `fma.rn.bf16`, so that product was never rounded and the GPU came within a rounding of
    # PyTorch, not bit for bit. The RoPE kernels are launched with `enable_fp_fusion=False` (`rope_launch`):
    # the PTX then has `mul.rn.bf16` and `add.rn.bf16`, PyTorch's operations (checked by compiling for sm_90
    # in tests/engine/test_triton_compiles_for_hopper.py; the interpreter never contracts).
    o1 = ((x1 * cos1).to(dt) + (-x2 * sin1).to(dt)).to(dt)
    o2 = ((x2 * cos2).to(dt) + (x1 * sin2).to(dt)).to(dt)
    return o1, o2


@triton.jit
def rms_norm_halves(x1, x2, W, eps, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """RMSNorm (weight `W`, in the head's dtype) of a head held as its two halves, rounded where
    `_rmsnorm_kernel` rounds: Qwen3's per-head q/k norm inside the RoPE kernels."""
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    dt = x1.dtype
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    inv = tl.rsqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0)) / (2 * HALF) + eps)
    w1 = tl.load(W + offs, mask=mask, other=0.0).to(dt)
    w2 = tl.load(W + HALF + offs, mask=mask, other=0.0).to(dt)
    return ((f1 * inv).to(dt) * w1).to(dt), ((f2 * inv).to(dt) * w2).to(dt)


@triton.jit
def rotate_qk_head(
    Q, K, CS, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """`rotate_head` of this program's head in a RoPE kernel's (token t, head h) grid: query head h, or
    key head h - NUM_Q_HEADS. Returns (t, h, o1, o2)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    if h < NUM_Q_HEADS:
        src = Q + t * stride_qt + h * stride_qh
    else:
        src = K + t * stride_kt + (h - NUM_Q_HEADS) * stride_kh
    o1, o2 = rotate_head(src, CS + t * stride_cs, HALF, BLOCK)
    return t, h, o1, o2


@triton.jit
def store_halves(dst, o1, o2, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """Write a head's two halves at `dst`, in dst's dtype."""
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    dt = dst.dtype.element_ty
    tl.store(dst + offs, o1.to(dt), mask=mask)
    tl.store(dst + HALF + offs, o2.to(dt), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, CS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh, stride_cs,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    t, h, o1, o2 = rotate_qk_head(
        Q, K, CS, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs, NUM_Q_HEADS, HALF, BLOCK
    )
    if h < NUM_Q_HEADS:
        dst = QO + t * stride_qot + h * stride_qoh
    else:
        dst = KO + t * stride_kot + (h - NUM_Q_HEADS) * stride_koh
    store_halves(dst, o1, o2, HALF, BLOCK)


def rope_operands(
    cos_sin: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cos_sin, q, k, q_out, k_out) as the RoPE kernels take them: each head dimension contiguous, cos|sin
    in q's dtype, and the outputs allocated contiguous."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if cos_sin.stride(-1) != 1:
        cos_sin = cos_sin.contiguous()
    if cos_sin.dtype != q.dtype:
        cos_sin = cos_sin.to(q.dtype)
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    return cos_sin, q, k, qo, ko


def rope_launch(q: torch.Tensor, k: torch.Tensor) -> tuple[tuple[int, int], dict[str, int]]:
    """The grid (one program per token and query or key head) and the constants of a RoPE kernel for q
    [T, H, D] and k [T, KVH, D]. Compiled without floating-point contraction (`rotate_halves` says why)."""
    t, num_heads, d = q.shape
    half = d // 2
    block = max(16, triton.next_power_of_2(half))
    consts = dict(NUM_Q_HEADS=num_heads, HALF=half, BLOCK=block, num_warps=1 if half <= 64 else 2)
    return (t, num_heads + k.shape[1]), {**consts, "enable_fp_fusion": False}


def apply_rope(cos_sin: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotation of q [T, H, D] and k [T, KVH, D] by cos|sin rows [T, 2D] (activation dtype)."""
    cos_sin, q, k, qo, ko = rope_operands(cos_sin, q, k)
    if q.shape[0] == 0:
        return qo, ko
    grid, consts = rope_launch(q, k)
    _rope_kernel[grid](
        q, k, qo, ko, cos_sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
        cos_sin.stride(0),
        **consts,
    )  # fmt: skip
    return qo, ko
