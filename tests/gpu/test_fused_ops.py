"""Fused RMSNorm / SiLU-and-mul / RoPE kernels against the PyTorch reference paths they replace on CUDA."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tokenspeed.runtime.kernels.fused_ops import apply_rope, rms_norm, silu_and_mul  # noqa: E402
from tokenspeed.runtime.layers import rotary  # noqa: E402
from tokenspeed.runtime.layers.norm import RMSNorm  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:  # at most one bf16 rounding apart
        torch.testing.assert_close(a.float(), b.float(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hidden", [64, 4096, 5120])
def test_rms_norm(dtype, hidden):
    norm = RMSNorm(hidden, 1e-5).cuda().to(dtype)
    norm.weight.data.normal_()
    x = torch.randn(33, hidden, device="cuda", dtype=dtype)
    r = torch.randn(33, hidden, device="cuda", dtype=dtype)
    _close(rms_norm(x, norm.weight, 1e-5), norm._norm(x), dtype)
    y, res = rms_norm(x, norm.weight, 1e-5, r)
    assert torch.equal(res, x + r)
    _close(y, norm._norm(x + r), dtype)
    heads = torch.randn(7, 8, hidden, device="cuda", dtype=dtype)  # per-head q/k norm shape
    _close(rms_norm(heads, norm.weight, 1e-5), norm._norm(heads), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_and_mul(dtype):
    x = torch.randn(17, 2 * 14336, device="cuda", dtype=dtype)
    gate, up = x.chunk(2, dim=-1)
    _close(silu_and_mul(x), torch.nn.functional.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_rope(dtype, head_dim):
    t, h, kvh = 19, 8, 2
    qkv = torch.randn(t, (h + 2 * kvh) * head_dim, device="cuda", dtype=dtype)
    q, k, _ = qkv.split([h * head_dim, kvh * head_dim, kvh * head_dim], dim=-1)
    q, k = q.reshape(t, h, head_dim), k.reshape(t, kvh, head_dim)  # strided views, as in the model
    emb = rotary.RotaryEmbedding(head_dim, 512, {"rope_theta": 10000.0, "rope_type": "default"}).cuda()
    emb.init_buffers()
    cos_sin = emb.cos_sin(torch.randint(0, 512, (t,), device="cuda"), dtype)
    cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)
    ref_q = q * cos + rotary._rotate_half(q) * sin
    ref_k = k * cos + rotary._rotate_half(k) * sin
    got_q, got_k = apply_rope(cos_sin, q, k)
    # PyTorch's own bits: each product and the sum rounded to the dtype, the kernels compiled without
    # contraction into FMAs (fused_ops.rope_launch)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_store_kv_equals_rope_then_store(dtype, head_dim):
    """The fused RoPE + KV write gives bit for bit what the two launches it replaces give."""
    from tokenspeed.runtime.kernels.kv_store import store_kv
    from tokenspeed.runtime.kernels.rope_store import rope_store_kv

    t, h, kvh, slots = 23, 32, 8, 97
    qkv = torch.randn(t, (h + 2 * kvh) * head_dim, device="cuda", dtype=dtype)
    q, k, v = qkv.split([h * head_dim, kvh * head_dim, kvh * head_dim], dim=-1)
    q, k, v = (x.reshape(t, -1, head_dim) for x in (q, k, v))  # strided views, as in the model
    emb = rotary.RotaryEmbedding(head_dim, 512, {"rope_theta": 500000.0, "rope_type": "default"}).cuda()
    emb.init_buffers()
    cos_sin = emb.cos_sin(torch.randint(0, 512, (t,), device="cuda"), dtype)
    loc = torch.randperm(slots - 1, device="cuda")[:t] + 1
    k_ref, v_ref = (torch.zeros(slots, kvh, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    q_ref, kr_ref = apply_rope(cos_sin, q, k)
    store_kv(kr_ref, v, k_ref, v_ref, loc)
    k_buf, v_buf = (torch.zeros(slots, kvh, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    got_q, got_k = rope_store_kv(cos_sin, q, k, v, k_buf, v_buf, loc)
    assert torch.equal(got_q, q_ref) and torch.equal(got_k, kr_ref)
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rope_store_kv_with_qk_norm_equals_norms_then_rope_store(dtype):
    """Qwen3's per-head q/k RMSNorm inside the fused kernel: what the RMSNorm kernel and then the fused RoPE +
    KV write give, within one rounding of the norm (its sum of squares adds two halves)."""
    from tokenspeed.runtime.kernels.fused_ops import rms_norm
    from tokenspeed.runtime.kernels.rope_store import rope_store_kv

    head_dim, t, h, kvh, slots, eps = 128, 23, 32, 4, 97, 1e-6
    qkv = torch.randn(t, (h + 2 * kvh) * head_dim, device="cuda", dtype=dtype) * 3
    q, k, v = qkv.split([h * head_dim, kvh * head_dim, kvh * head_dim], dim=-1)
    q, k, v = (x.reshape(t, -1, head_dim) for x in (q, k, v))
    qw, kw = (torch.rand(head_dim, device="cuda", dtype=dtype) + 0.5 for _ in range(2))
    emb = rotary.RotaryEmbedding(head_dim, 512, {"rope_theta": 1000000.0, "rope_type": "default"}).cuda()
    emb.init_buffers()
    cos_sin = emb.cos_sin(torch.randint(0, 512, (t,), device="cuda"), dtype)
    loc = torch.randperm(slots - 1, device="cuda")[:t] + 1
    bufs = [torch.zeros(slots, kvh, head_dim, device="cuda", dtype=dtype) for _ in range(4)]
    ref_q, ref_k = rope_store_kv(cos_sin, rms_norm(q, qw, eps), rms_norm(k, kw, eps), v, bufs[0], bufs[1], loc)
    got_q, got_k = rope_store_kv(cos_sin, q, k, v, bufs[2], bufs[3], loc, (qw, kw, eps))
    _close(got_q, ref_q, dtype)
    _close(got_k, ref_k, dtype)
    _close(bufs[2], bufs[0], dtype)
    assert torch.equal(bufs[3], bufs[1])  # v is copied, not normed
