"""The few-token MoE GEMV (`moe/kernels/gemv.py`) on the GPU against the float32 reference: the Qwen3-30B-A3B
expert shape and odd ones, every launch config `benchmarks/moe_tune.py --gemv` sweeps, remote experts, FP8
experts, CUDA-graph replay, and the engine decoding in graphs with the GEMV forced on."""

from __future__ import annotations

import json

import pytest
import torch

from tests.gpu.test_fused_moe import PARAMS, _engine, moe_reference  # noqa: F401  (a fixture)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("triton")

from benchmarks.moe_gemv_tune import DOWN, GATE_UP, down_config, gate_up_config  # noqa: E402
from tokenspeed.runtime.layers.quantization.fp8 import ExpertScales  # noqa: E402
from tokenspeed.runtime.layers.quantization.fp8_math import quantize_block, quantize_per_channel  # noqa: E402
from tokenspeed.runtime.moe.backend import FUSED_ROUTE_ENV, TritonMoe, torch_experts  # noqa: E402
from tokenspeed.runtime.moe.kernels import gemv_table  # noqa: E402
from tokenspeed.runtime.moe.kernels.gemv import (  # noqa: E402
    MoeGemvConfig,
    Routing,
    arrival_tiles,
    moe_gemv,
    moe_gemv_routed,
)
from tokenspeed.runtime.moe.kernels.routing import fused_route  # noqa: E402

SWEPT = [gate_up_config(MoeGemvConfig(), *c) for c in GATE_UP] + [
    down_config(MoeGemvConfig(), *c) for c in DOWN
]


def _case(tokens, num_experts, hidden, inter, top_k, dtype, seed=0):
    torch.manual_seed(seed)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, device="cuda") * 0.03).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, device="cuda") * 0.03).to(dtype)
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    weights, ids = torch.softmax(torch.randn(tokens, num_experts, device="cuda"), -1).topk(top_k, dim=-1)
    return x, w13, w2, weights, ids.to(torch.int32)


def _rel(a, b) -> float:
    return float((a.float() - b).norm() / b.norm())


@pytest.mark.parametrize("tokens", [1, 2, 4, 16])
def test_every_swept_config_matches_reference_on_the_qwen3_shape(tokens):
    x, w13, w2, weights, ids = _case(tokens, 128, 2048, 768, 8, torch.bfloat16, tokens)
    ref = torch_experts(x.float(), w13.float(), w2.float(), weights, ids)
    worst = {}
    for cfg in SWEPT:
        got = moe_gemv(x, w13, w2, weights, ids, cfg)
        assert got.dtype == torch.bfloat16 and got.shape == x.shape
        worst[str(cfg)] = _rel(got, ref)
    print(f"moe gemv tokens={tokens}: {len(worst)} configs, worst rel err {max(worst.values()):.3g}")
    assert all(e < 2e-2 for e in worst.values()), worst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("top_k", [2, 8])
@pytest.mark.parametrize("tokens", [1, 3, 7])
def test_odd_sizes_and_remote_experts(dtype, top_k, tokens):
    x, w13, w2, weights, ids = _case(tokens, 24, 200, 72, top_k, dtype, tokens + top_k)
    ids[0, 0] = -1
    ids[-1, :] = -1  # all of the last token's experts remote: zeros
    ref = torch_experts(x.float(), w13.float(), w2.float(), weights, ids)
    for cfg in (
        MoeGemvConfig(),
        MoeGemvConfig(block_n=8, block_k=64, prefetch=2, down_block_h=8, down_split=2),
        # K = 200: 4 chunks of 64 over 3 splits of 2, the last split empty
        MoeGemvConfig(block_n=8, block_k=64, prefetch=1, split=3, down_block_h=4),
    ):
        got = moe_gemv(x, w13, w2, weights, ids, cfg)
        assert float(got[-1].abs().max()) == 0.0
        if tokens > 1:
            assert _rel(got[:-1], ref[:-1]) < (1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("block", [None, (128, 128)], ids=["channel", "block128"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_fp8_experts_match_dequantized_reference(block, tokens):
    x, w13, w2, weights, ids = _case(tokens, 16, 256, 384, 4, torch.float32, tokens)
    quant = quantize_per_channel if block is None else (lambda w: quantize_block(w, block))
    (q13, s13), (q2, s2) = quant(w13), quant(w2)
    scales = ExpertScales(s13, s2, block)
    ref = torch_experts(x, q13, q2, weights, ids, scales)
    for dtype in (torch.float32, torch.bfloat16):
        got = moe_gemv(x.to(dtype), q13, q2, weights, ids, MoeGemvConfig(block_k=512), scales)
        assert _rel(got, ref) < (1e-4 if dtype == torch.float32 else 2e-2)


def test_graph_replay_equals_eager():
    cfg = MoeGemvConfig(down_split=4)  # the atomics and the zeroed buffer inside the graph too
    for tokens in (1, 4):
        x, w13, w2, weights, ids = _case(tokens, 32, 256, 128, 4, torch.bfloat16, tokens)
        moe_gemv(x, w13, w2, weights, ids, cfg)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_gemv(x, w13, w2, weights, ids, cfg)
        x2, _, _, w_new, ids_new = _case(tokens, 32, 256, 128, 4, torch.bfloat16, tokens + 100)
        x.copy_(x2)
        weights.copy_(w_new)
        ids.copy_(ids_new)
        graph.replay()
        ref = torch_experts(x.float(), w13.float(), w2.float(), weights, ids)
        assert _rel(out, ref) < 2e-2


def test_backend_takes_the_gemv_only_where_the_table_says(tmp_path, monkeypatch):
    x, w13, w2, weights, ids = _case(2, 16, 128, 64, 4, torch.bfloat16)
    module = torch.nn.Module()
    module.w13, module.w2 = torch.nn.Parameter(w13, False), torch.nn.Parameter(w2, False)
    key = gemv_table.shape_key(16, 64, 128, torch.bfloat16)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(gemv_table.to_json("x", {key: {1: MoeGemvConfig(), 4: None}}, {})))
    monkeypatch.setenv(gemv_table.ENV, str(path))
    backend = TritonMoe(torch.device("cuda"))
    calls = []
    backend._gemv = lambda *a, **kw: calls.append(a[0].shape[0]) or moe_gemv(*a, **kw)
    ref = torch_experts(x.float(), w13.float(), w2.float(), weights, ids)
    for tokens in (1, 2):
        assert _rel(backend.experts(module, x[:tokens], weights[:tokens], ids[:tokens]), ref[:tokens]) < 2e-2
    assert calls == [1]  # 2 tokens: the table's null, the tensor-core path


@pytest.mark.parametrize(("split", "down_split"), [(1, 2), (1, 4), (1, 8), (2, 1), (4, 4), (8, 4)])
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_splits_merged_by_their_last_arrival(split, down_split, tokens):
    """The gate/up tiles split over K and the down kernel split over pairs, each merged by the last split to
    arrive: as accurate as the reference, the same bits on every launch whichever split arrives last, the
    counts back at zero, and in a CUDA graph."""
    x, w13, w2, weights, ids = _case(tokens, 128, 2048, 768, 8, torch.bfloat16, tokens + split + down_split)
    ref = torch_experts(x.float(), w13.float(), w2.float(), weights, ids)
    cfg = MoeGemvConfig(block_n=8, split=split, down_block_h=16, down_split=down_split)
    arrivals = torch.zeros(arrival_tiles(tokens, 8, 768, 2048, cfg), dtype=torch.int32, device="cuda")
    outs = [moe_gemv(x, w13, w2, weights, ids, cfg, arrivals=arrivals) for _ in range(30)]
    assert _rel(outs[0], ref) < 2e-2
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert int(arrivals.abs().sum()) == 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_gemv(x, w13, w2, weights, ids, cfg, arrivals=arrivals)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, outs[0]) and int(arrivals.abs().sum()) == 0


@pytest.mark.parametrize("split", [1, 4], ids=["gate_up_whole", "gate_up_split"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens", [1, 5, 16])
def test_routing_in_the_first_launch_chooses_as_the_routing_kernel(renormalize, tokens, split):
    x, w13, w2, _, _ = _case(tokens, 128, 2048, 768, 8, torch.bfloat16, tokens)
    logits = torch.randn(tokens, 128, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(tokens, dtype=torch.int32, device="cuda")
    mask[-1] = 0  # a padding row: routed, not counted
    want_counts = torch.zeros(128, dtype=torch.int32, device="cuda")
    ref_w, ref_ids = fused_route(logits, 8, renormalize, None, want_counts, mask)
    counts = torch.zeros(128, dtype=torch.int32, device="cuda")
    routing = Routing(logits, 8, renormalize, counts, mask)
    cfg = MoeGemvConfig(split=split, down_block_h=16, down_split=4)
    arrivals = torch.zeros(arrival_tiles(tokens, 8, 768, 2048, cfg), dtype=torch.int32, device="cuda")
    got, got_w, got_ids = moe_gemv_routed(x, w13, w2, routing, cfg, arrivals=arrivals)
    assert torch.equal(got_ids, ref_ids)
    assert torch.allclose(got_w, ref_w, rtol=0, atol=1e-6)
    assert torch.equal(counts, want_counts)
    assert _rel(got, torch_experts(x.float(), w13.float(), w2.float(), ref_w, ref_ids)) < 2e-2


@pytest.mark.parametrize("fused_route", [False, True], ids=["gemv", "gemv_routed"])
def test_engine_decodes_in_graphs_with_the_gemv_forced(moe_reference, monkeypatch, fused_route):  # noqa: F811
    """Greedy output with the GEMV forced for every captured batch (1-8), its routing in the first launch or
    not, equals transformers'."""
    monkeypatch.setenv(gemv_table.ENV, "force")
    monkeypatch.setenv(FUSED_ROUTE_ENV, "1" if fused_route else "0")
    path, prompts, expected = moe_reference
    with _engine(path, enable_expert_distribution_metrics=True) as engine:
        assert engine.core.runner.graph_runner is not None
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)]
    assert outs == expected
