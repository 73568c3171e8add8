"""The triton and flashinfer attention backends against a float64 reference and the torch backend, on
batches mixing fresh prefills, chunks over cached prefixes and decodes; plus CUDA-graph replay of decode."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.gpu.attention_cases import AttnCase, make_case, reference, rel_err
from tokenspeed.runtime.kernels.decode_attention import ONE_LAUNCH_ENV
from tokenspeed.runtime.layers.attention import create_attention_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MIXED = [(0, 37), (5, 1), (130, 64), (0, 1), (300, 1), (17, 200), (1000, 1), (63, 2)]
DECODE = [(n, 1) for n in (1, 15, 16, 17, 255, 1024, 3000, 4095)]
PREFILL = [(0, 1500), (512, 700)]
FRESH = [(0, 37), (0, 1), (0, 1500), (0, 64)]  # no cached prefix anywhere: flashinfer's ragged path
# (heads, kv heads, head_dim): Llama-3.1-8B per layer, the tiny test models, MHA, and a 64-dim GQA.
SHAPES = [(32, 8, 128), (4, 2, 16), (8, 8, 64), (16, 2, 64)]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _backend(name: str, case, **kw):
    heads = case.spec[0]
    cfg = SimpleNamespace(num_attention_heads=heads)
    return create_attention_backend(name, model_config=cfg, kv_pool=case.pool, device="cuda", **kw)


def _check_store(case) -> None:
    k_buf, v_buf = case.pool.get_kv(0)
    loc = case.fb.out_cache_loc
    assert torch.equal(k_buf[loc], case.k.to(k_buf.dtype))
    assert torch.equal(v_buf[loc], case.v.to(v_buf.dtype))


def _run(name: str, reqs, shape, dtype, block_size=16, seed=0):
    h, kvh, d = shape
    case = make_case(reqs, h, kvh, d, dtype, block_size=block_size, seed=seed)
    backend = _backend(name, case)
    case.fb.attn_backend = backend
    scaling = 1.0 / math.sqrt(d)
    backend.init_forward_metadata(case.fb)
    out = backend.forward(case.q, case.k, case.v, 0, case.fb, scaling)
    torch.cuda.synchronize()
    _check_store(case)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    assert torch.isfinite(out).all()
    return case, out, reference(case, 0, scaling)


def _torch_backend_out(reqs, shape, dtype, block_size=16, seed=0):
    h, kvh, d = shape
    case = make_case(reqs, h, kvh, d, dtype, block_size=block_size, seed=seed)
    backend = _backend("torch", case)
    case.fb.attn_backend = backend
    backend.init_forward_metadata(case.fb)
    return backend.forward(case.q, case.k, case.v, 0, case.fb, 1.0 / math.sqrt(d))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reqs", [MIXED, DECODE, PREFILL], ids=["mixed", "decode", "prefill"])
def test_triton_matches_reference(reqs, dtype, shape):
    _, out, ref = _run("triton", reqs, shape, dtype)
    assert rel_err(out, ref) < TOL[dtype]
    torch_out = _torch_backend_out(reqs, shape, dtype)
    assert rel_err(out, torch_out.double()) < 2 * TOL[dtype]


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_triton_block_sizes(block_size):
    _, out, ref = _run("triton", MIXED, (8, 2, 64), torch.bfloat16, block_size=block_size, seed=3)
    assert rel_err(out, ref) < TOL[torch.bfloat16]


def test_triton_reduce_in_fp32():
    case = make_case(MIXED, 8, 2, 64, torch.bfloat16)
    backend = _backend("triton", case, reduce_in_fp32=True)
    backend.init_forward_metadata(case.fb)
    out = backend.forward(case.q, case.k, case.v, 0, case.fb, 0.125)
    assert rel_err(out, reference(case, 0, 0.125)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("shape", [(32, 8, 128), (8, 8, 128)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("reqs", [MIXED, DECODE, PREFILL, FRESH], ids=["mixed", "decode", "prefill", "fresh"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_flashinfer_matches_reference(reqs, shape, block_size):
    pytest.importorskip("flashinfer")
    _, out, ref = _run("flashinfer", reqs, shape, torch.bfloat16, block_size=block_size)
    assert rel_err(out, ref) < TOL[torch.bfloat16]


def test_flashinfer_rejects_float32_cache():
    pytest.importorskip("flashinfer")
    case = make_case(DECODE, 8, 8, 128, torch.float32)
    with pytest.raises(ValueError, match="bfloat16"):
        _backend("flashinfer", case)


@pytest.mark.parametrize(
    "shape", [(32, 8, 128), (32, 4, 128), (16, 2, 64)], ids=["llama8b", "qwen3moe", "d64"]
)
@pytest.mark.parametrize("batch", [1, 3, 16, 64, 300])
def test_triton_one_launch_decode(monkeypatch, shape, batch):
    """Decode attention in one launch (the last split of each request and kv head merges) against the
    float64 reference and the two-launch path, at batch sizes whose split counts run from 16 down to 1;
    repeated, since on the GPU any split may arrive last: every repeat gives the same bits."""
    lens = [(1 + (37 * i + 11) % 2000, 1) for i in range(batch)]
    dtype, scaling = torch.bfloat16, 1.0 / math.sqrt(shape[2])
    monkeypatch.setenv(ONE_LAUNCH_ENV, "0")
    case, two, ref = _run("triton", lens, shape, dtype, seed=5)
    monkeypatch.setenv(ONE_LAUNCH_ENV, "1")
    backend = _backend("triton", case)
    case.fb.attn_backend = backend
    backend.init_forward_metadata(case.fb)
    outs = [backend.forward(case.q, case.k, case.v, 0, case.fb, scaling) for _ in range(20)]
    torch.cuda.synchronize()
    assert rel_err(outs[0], ref) < TOL[dtype]
    assert rel_err(outs[0], two.double()) < TOL[dtype]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert backend.arrivals.all_zero()  # every launch left its counts at zero


@pytest.mark.parametrize("one_launch", [False, True], ids=["two_launch", "one_launch"])
@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_decode_graph_replay_equals_eager(monkeypatch, name, one_launch):
    """Capture decode at one batch size, then replay it on a batch with other contexts and pages."""
    if name == "flashinfer":
        if one_launch:
            pytest.skip("one-launch decode is the triton backend's")
        pytest.importorskip("flashinfer")
    monkeypatch.setenv(ONE_LAUNCH_ENV, "1" if one_launch else "0")
    shape, dtype = (32, 8, 128), torch.bfloat16
    first = make_case([(n, 1) for n in (10, 200, 33, 1500)], *shape, dtype, seed=1, num_pages=400)
    second = make_case([(n, 1) for n in (700, 3, 2047, 64)], *shape, dtype, seed=2, num_pages=400)
    # Replay reads the captured buffers: the second batch is copied into the first one's tensors.
    backend = _backend(name, first)
    backend.init_cuda_graph_state(max_bs=8, max_context_len=4096)
    fb = first.fb
    fb.attn_backend = backend
    # Re-point the first case at a table wide enough for the second batch's contexts.
    wide = torch.zeros((fb.req_to_token.shape[0] + 4, 4096 + 16), dtype=torch.int32, device="cuda")
    wide[: fb.req_to_token.shape[0], : fb.req_to_token.shape[1]] = fb.req_to_token
    fb.req_to_token = wide
    scaling = 1.0 / math.sqrt(shape[2])
    q = first.q.clone()
    k, v = first.k.clone(), first.v.clone()
    backend.init_forward_metadata(fb)
    backend.forward(q, k, v, 0, fb, scaling)  # warm-up: allocates scratch, compiles kernels
    torch.cuda.synchronize()
    backend.init_forward_metadata_capture(fb)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, 0, fb, scaling)

    # Load the second batch into the static tensors and the first case's pool.
    sfb = second.fb
    for name_ in ("seq_lens", "req_pool_indices", "out_cache_loc", "positions"):
        getattr(fb, name_).copy_(getattr(sfb, name_))
    fb.req_to_token.zero_()
    fb.req_to_token[: sfb.req_to_token.shape[0], : sfb.req_to_token.shape[1]] = sfb.req_to_token
    for dst, src in zip(first.pool.get_kv(0), second.pool.get_kv(0), strict=True):
        dst.copy_(src)
    fb.seq_lens_cpu = list(sfb.seq_lens_cpu)
    q.copy_(second.q)
    k.copy_(second.k)
    v.copy_(second.v)
    backend.init_forward_metadata_replay(fb)
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()

    backend.init_forward_metadata(fb)
    eager = backend.forward(q, k, v, 0, fb, scaling)
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)
    # The float64 reference of the second batch, read from the pool the replay stored into.
    loaded = AttnCase(fb, q, k, v, first.pool, first.spec)
    assert rel_err(replayed, reference(loaded, 0, scaling)) < TOL[dtype]


@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_fused_rope_store_path_equals_unfused(name):
    """The attention layer with cos/sin given (fused RoPE + KV write, then `kv_stored=True`) produces the
    output and pool contents of rotating first and letting the backend store."""
    if name == "flashinfer":
        pytest.importorskip("flashinfer")
    from tokenspeed.runtime.layers.attention import PagedAttention
    from tokenspeed.runtime.layers.rotary import RotaryEmbedding, apply_rotary

    shape, dtype = (32, 8, 128), torch.bfloat16
    outs, pools = [], []
    for fused in (True, False):
        for reqs in (MIXED, DECODE, FRESH):
            case = make_case(reqs, *shape, dtype, seed=5)
            backend = _backend(name, case)
            if not fused:
                backend.supports_fused_rope_store = False
            case.fb.attn_backend = backend
            emb = RotaryEmbedding(shape[2], 8192, {"rope_theta": 500000.0, "rope_type": "default"}).cuda()
            emb.init_buffers()
            cos_sin = emb.cos_sin(case.fb.positions, dtype)
            layer = PagedAttention(*shape, 1.0 / math.sqrt(shape[2]), layer_id=0)
            backend.init_forward_metadata(case.fb)
            outs.append(layer(case.q, case.k, case.v, case.fb, cos_sin=cos_sin))
            pools.append(torch.cat(case.pool.get_kv(0)))
            if fused:
                q_rot, k_rot = apply_rotary(cos_sin, case.q, case.k)
                loaded = AttnCase(case.fb, q_rot, k_rot, case.v, case.pool, case.spec)
                ref = reference(loaded, 0, 1.0 / math.sqrt(shape[2]))
                assert rel_err(outs[-1].view(ref.shape), ref) < TOL[dtype]
    half = len(outs) // 2
    for a, b in zip(outs[:half], outs[half:], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(pools[:half], pools[half:], strict=True):
        assert torch.equal(a, b)
