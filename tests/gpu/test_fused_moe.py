"""The fused Triton MoE (the default `--moe-backend auto` on CUDA) against the reference, inside CUDA
graphs, with expert recording and a live rebalance."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_engine_gpu import MAX_NEW
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import load_hf_model, make_tiny_model
from tokenspeed.runtime.moe.backend import TorchMoe
from tokenspeed.runtime.moe.experts import TorchExperts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("triton")

from tokenspeed.runtime.moe.dispatch import ExpertDispatch  # noqa: E402
from tokenspeed.runtime.moe.expert_location import ExpertLocation  # noqa: E402
from tokenspeed.runtime.moe.kernels.configs import MoeKernelConfig  # noqa: E402
from tokenspeed.runtime.moe.kernels.fused import fused_experts  # noqa: E402
from tokenspeed.runtime.moe.kernels.routing import fused_route  # noqa: E402

PAIRS = MoeKernelConfig(pairs=True, block_n=32)
GROUPED = MoeKernelConfig(block_m=16)
GROUPED64 = MoeKernelConfig(block_m=64, block_k=64, down_block_n=128, down_block_k=64)


def _experts(num_experts, hidden, inter, dtype):
    ex = TorchExperts(num_experts, hidden, inter).cuda()
    with torch.no_grad():
        ex.w13.normal_(0, 0.05)
        ex.w2.normal_(0, 0.05)
    return ex.to(dtype)


def _routing(tokens, num_experts, top_k):
    logits = torch.randn(tokens, num_experts, device="cuda")
    weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


@pytest.mark.parametrize("cfg", [None, PAIRS, GROUPED, GROUPED64], ids=["table", "pairs", "bm16", "bm64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 7, 64, 700])
def test_fused_matches_reference(cfg, dtype, tokens):
    torch.manual_seed(tokens)
    ex = _experts(128, 256, 96, dtype)
    x = torch.randn(tokens, 256, device="cuda", dtype=dtype)
    weights, ids = _routing(tokens, 128, 8)
    ref = ex(x, weights.to(dtype), ids).double()
    out = fused_experts(x, ex.w13, ex.w2, weights, ids, cfg).double()
    err = float((out - ref).norm() / ref.norm())
    assert err < (1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("cfg", [PAIRS, GROUPED], ids=["pairs", "grouped"])
def test_remote_experts_contribute_nothing(cfg):
    """Ids < 0 (experts on another rank under EP) are skipped, like the reference."""
    ex = _experts(16, 64, 32, torch.float32)
    x = torch.randn(9, 64, device="cuda")
    weights, ids = _routing(9, 16, 4)
    ids[::2, 1] = -1
    kept = ids >= 0
    ref = ex(x, weights * kept, torch.where(kept, ids, torch.zeros_like(ids)))
    torch.testing.assert_close(fused_experts(x, ex.w13, ex.w2, weights, ids, cfg), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
def test_fused_route_matches_reference_with_dispatch_and_counts(algorithm):
    torch.manual_seed(3)
    loc = ExpertLocation.trivial(num_layers=1, num_logical=64, num_redundant=8, ep_size=1)
    view = ExpertDispatch(loc, max_replicas=9, device="cuda").view(0, algorithm, 1, 0, loc.slots_per_rank)
    logits = torch.randn(37, 64, device="cuda")  # float32: no exact ties for top-k to order
    mask = torch.arange(37, device="cuda") % 5  # rows with 0 are padding: routed, not counted
    counts = torch.zeros(72, dtype=torch.int32, device="cuda")
    ref_counts = torch.zeros(72, dtype=torch.int32, device="cuda")
    w, ids = fused_route(logits, 8, True, view, counts, mask)
    ref_w, ref_ids = TorchMoe().route(logits, 8, True, view, ref_counts, mask)
    assert torch.equal(ids.long(), ref_ids.long())
    torch.testing.assert_close(w, ref_w.float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(counts, ref_counts) and int(counts.sum()) == 8 * int((mask != 0).sum())


def test_graph_replay_equals_eager():
    ex = _experts(32, 128, 64, torch.bfloat16)
    for tokens in (2, 16):  # the pair layout and the grouped one
        x = torch.randn(tokens, 128, device="cuda", dtype=torch.bfloat16)
        weights, ids = _routing(tokens, 32, 4)
        fused_experts(x, ex.w13, ex.w2, weights, ids)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_experts(x, ex.w13, ex.w2, weights, ids)
        new_w, new_ids = _routing(tokens, 32, 4)
        x.copy_(torch.randn_like(x))
        weights.copy_(new_w)
        ids.copy_(new_ids)
        graph.replay()
        torch.testing.assert_close(out, fused_experts(x, ex.w13, ex.w2, weights, ids), rtol=0, atol=0)


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory):
    from tests.engine.test_engine_correctness import make_prompts

    path = make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("moe"))
    hf = load_hf_model(path).to("cuda")
    prompts = make_prompts(hf.config.vocab_size)
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    return path, prompts, expected


def _engine(path, **kwargs):
    from tokenspeed import Engine

    opts = dict(
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        sampling_backend="triton",
        block_size=4,
        max_total_tokens=4096,
        cudagraph_capture_sizes=[1, 2, 4, 8],
    )
    return Engine(model=path, **{**opts, **kwargs})


PARAMS = {"max_new_tokens": MAX_NEW, "temperature": 0.0}


@pytest.mark.parametrize("record", [False, True], ids=["plain", "recording"])
def test_default_backend_decodes_in_graphs_and_matches_eager(moe_reference, record):
    """`--moe-backend auto` is the fused path on CUDA; greedy output with graphs equals eager and
    transformers, with the expert recorder and metrics on or off; the recorded load of the captured run
    equals the eager run's (CUDA-graph padding rows are not counted)."""
    path, prompts, expected = moe_reference
    extra = dict(enable_expert_distribution_metrics=True) if record else {}
    loads = {}
    for eager in (False, True):
        with _engine(path, enforce_eager=eager, **extra) as engine:
            runner = engine.core.runner
            assert (runner.graph_runner is None) == eager, "no MoE setting may force eager decoding"
            outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)]
            assert outs == expected, f"eager={eager} record={record}"
            if record:
                loads[eager] = engine.core.experts.recorder.window_counts()
            assert_no_kv_leak(engine)
    if record:
        assert int(loads[True].sum()) > 0
        assert torch.equal(loads[False], loads[True])


def test_rebalance_mid_decode_keeps_greedy_output(moe_reference):
    """Redundant experts on one GPU: a rebalance between two captured decode steps moves weights and
    rewrites the dispatch tables in place; the greedy output is unchanged and nothing is re-captured."""
    path, prompts, expected = moe_reference
    with _engine(path, ep_num_redundant_experts=4, enable_expert_distribution_metrics=True) as engine:
        runner = engine.core.runner
        graphs = dict(runner.graph_runner.graphs)
        experts = engine.core.experts
        before = experts.state.location.placement.phy2log.clone()
        outs: dict[int, list[int]] = {}
        for n, chunk in enumerate(engine.generate(input_ids=prompts, sampling_params=PARAMS, stream=True)):
            outs.setdefault(chunk["index"], []).extend(chunk["output_ids"])
            if n == 3 * len(prompts):
                experts.request_rebalance()
        assert [outs[i] for i in range(len(prompts))] == expected
        assert experts.eplb.stats.rebalances == 1 and experts.eplb.stats.last.moved_slots > 0
        assert not torch.equal(before, experts.state.location.placement.phy2log)
        assert runner.graph_runner.graphs == graphs  # the same graphs, replayed after the move
