"""The torch attention backend against a naive per-token reference, over a scattered paged cache."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tokenspeed.runtime.cache.kv_pool import KVPool, KVPoolSpec
from tokenspeed.runtime.execution.forward_batch import ForwardBatch
from tokenspeed.runtime.layers.attention import attention_backend_registry, create_attention_backend

HEADS, KV_HEADS, DIM, BLOCK = 8, 2, 16, 4


def naive_attention(q, k_buf, v_buf, slots_per_token, scale):
    """Token by token, head by head: softmax(q . K^T * scale) V over the slots the token may see."""
    out = torch.empty_like(q)
    group = HEADS // KV_HEADS
    for t, slots in enumerate(slots_per_token):
        for h in range(HEADS):
            keys = k_buf[slots, h // group].double()
            vals = v_buf[slots, h // group].double()
            w = torch.softmax(keys @ q[t, h].double() * scale, dim=0)
            out[t, h] = (w[:, None] * vals).sum(0).to(q.dtype)
    return out


# (tokens already cached, new tokens): a fresh prefill, a second chunk, decodes, a one-token prompt
MIXED = [(0, 9), (6, 5), (13, 1), (1, 1), (0, 1), (7, 3)]


def _mixed_batch(device, dtype, shapes=MIXED):
    gen = torch.Generator().manual_seed(0)
    num_pages = 32
    pool = KVPool(KVPoolSpec(1, KV_HEADS, DIM, dtype, BLOCK), num_pages, device)
    # Scatter each request over the pool (never page 0), so a wrong gather cannot pass by accident.
    free = (torch.randperm(num_pages * BLOCK - BLOCK, generator=gen) + BLOCK).tolist()
    req_to_token = torch.zeros(len(shapes) + 2, 64, dtype=torch.int32, device=device)
    rows = [len(shapes) + 1 - i for i in range(len(shapes))]  # rows out of order too
    locs, positions, visible = [], [], []
    for r, (prefix, ext) in zip(rows, shapes, strict=True):
        slots = [free.pop() for _ in range(prefix + ext)]
        req_to_token[r, : prefix + ext] = torch.tensor(slots, dtype=torch.int32)
        if prefix:
            pool.set_kv(
                0,
                torch.tensor(slots[:prefix], device=device),
                torch.randn(prefix, KV_HEADS, DIM, generator=gen).to(device),
                torch.randn(prefix, KV_HEADS, DIM, generator=gen).to(device),
            )
        locs += slots[prefix:]
        positions += range(prefix, prefix + ext)
        visible += [slots[: prefix + i + 1] for i in range(ext)]
    num_tokens = len(locs)
    seq_lens = [p + e for p, e in shapes]
    ext_lens = [e for _, e in shapes]

    def t(x, dt=torch.int64):
        return torch.tensor(x, dtype=dt, device=device)

    fb = ForwardBatch(
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=t(positions),
        out_cache_loc=t(locs),
        req_pool_indices=t(rows, torch.int32),
        seq_lens=t(seq_lens, torch.int32),
        extend_lens=t(ext_lens, torch.int32),
        extend_prefix_lens=t([p for p, _ in shapes], torch.int32),
        logits_indices=torch.tensor(ext_lens).cumsum(0).to(device) - 1,
        req_to_token=req_to_token,
        kv_pool=pool,
        attn_backend=None,
        seq_lens_cpu=seq_lens,
        extend_lens_cpu=ext_lens,
    )
    q = torch.randn(num_tokens, HEADS, DIM, generator=gen).to(device, dtype)
    k = torch.randn(num_tokens, KV_HEADS, DIM, generator=gen).to(device, dtype)
    v = torch.randn(num_tokens, KV_HEADS, DIM, generator=gen).to(device, dtype)
    return fb, q, k, v, visible


@pytest.mark.parametrize(
    "device,dtype,tol",
    [
        ("cpu", torch.float32, 1e-5),
        ("cpu", torch.bfloat16, 2e-2),
        pytest.param("cuda", torch.float32, 1e-4, marks=pytest.mark.gpu),
        pytest.param("cuda", torch.bfloat16, 2e-2, marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("host_lists", [True, False], ids=["host-lens", "device-lens"])
def test_torch_backend_matches_naive_on_mixed_batch(device, dtype, tol, host_lists):
    fb, q, k, v, visible = _mixed_batch(device, dtype)
    if not host_lists:
        fb.seq_lens_cpu, fb.extend_lens_cpu = [], []
    backend = create_attention_backend("torch", SimpleNamespace(), fb.kv_pool, device)
    fb.attn_backend = backend
    scale = 1 / math.sqrt(DIM)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, 0, fb, scale)
    # the new tokens' K/V landed at their slots
    k_buf, v_buf = fb.kv_pool.get_kv(0)
    torch.testing.assert_close(k_buf[fb.out_cache_loc], k)
    torch.testing.assert_close(v_buf[fb.out_cache_loc], v)
    ref = naive_attention(q.cpu(), k_buf.cpu(), v_buf.cpu(), visible, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)


def test_decode_only_batch_and_metadata_reused_across_calls():
    fb, q, k, v, visible = _mixed_batch("cpu", torch.float32, shapes=[(20, 1), (3, 1), (0, 1), (9, 1)])
    backend = create_attention_backend("torch", None, fb.kv_pool, "cpu")
    backend.init_forward_metadata(fb)
    first = backend.forward(q, k, v, 0, fb, 0.25)
    k_buf, v_buf = fb.kv_pool.get_kv(0)
    torch.testing.assert_close(first, naive_attention(q, k_buf, v_buf, visible, 0.25), atol=1e-5, rtol=1e-5)
    # metadata is built once a step and every layer reuses it
    torch.testing.assert_close(backend.forward(q, k, v, 0, fb, 0.25), first)


def test_registry_names_and_unknown_backend():
    assert "torch" in attention_backend_registry().names()
    with pytest.raises(ValueError, match="--attention-backend 'nope'.*torch"):
        create_attention_backend("nope", None, None, "cpu")


def test_attention_layer_rotates_q_and_k_before_storing_and_attending():
    """PagedAttention given the step's cos/sin rows: the pool holds rotated keys and the output is attention
    of rotated queries over them (on the GPU the rotation and the store are one kernel; here two steps)."""
    from tokenspeed.runtime.layers.attention import PagedAttention
    from tokenspeed.runtime.layers.rotary import RotaryEmbedding, apply_rotary

    fb, q, k, v, visible = _mixed_batch("cpu", torch.float32)
    backend = create_attention_backend("torch", None, fb.kv_pool, "cpu")
    fb.attn_backend = backend
    emb = RotaryEmbedding(DIM, 64, {"rope_theta": 10000.0, "rope_type": "default"})
    emb.init_buffers()
    cos_sin = emb.cos_sin(fb.positions)
    layer = PagedAttention(HEADS, KV_HEADS, DIM, 0.25, layer_id=0)
    backend.init_forward_metadata(fb)
    out = layer(q.reshape(len(q), -1), k.reshape(len(k), -1), v.reshape(len(v), -1), fb, cos_sin=cos_sin)
    q_rot, k_rot = apply_rotary(cos_sin, q, k)
    assert not torch.allclose(q_rot, q)  # positions > 0 rotate
    k_buf, v_buf = fb.kv_pool.get_kv(0)
    torch.testing.assert_close(k_buf[fb.out_cache_loc], k_rot)
    torch.testing.assert_close(v_buf[fb.out_cache_loc], v)
    ref = naive_attention(q_rot, k_buf, v_buf, visible, 0.25)
    torch.testing.assert_close(out.view(q.shape), ref, atol=1e-5, rtol=1e-5)
