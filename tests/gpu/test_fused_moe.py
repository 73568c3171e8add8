"""The fused Triton MoE (`--moe-backend triton`) against the reference experts, and inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_engine_gpu import MAX_NEW
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import load_hf_model, make_tiny_model
from tokenspeed.runtime.layers.moe.experts import TorchExperts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("triton")

from tokenspeed.runtime.kernels.fused_moe import fused_experts  # noqa: E402


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 7, 64, 700])
def test_fused_matches_reference(dtype, tokens):
    torch.manual_seed(tokens)
    ex = _experts(128, 256, 96, dtype)
    x = torch.randn(tokens, 256, device="cuda", dtype=dtype)
    weights, ids = _routing(tokens, 128, 8)
    ref = ex(x, weights, ids).double()
    out = fused_experts(x, ex.w13, ex.w2, weights, ids).double()
    err = float((out - ref).norm() / ref.norm())
    assert err < (1e-5 if dtype == torch.float32 else 2e-2)


def test_remote_experts_contribute_nothing():
    """Ids < 0 (experts on another rank under EP) are skipped, like the reference's `_experts_forward`."""
    ex = _experts(16, 64, 32, torch.float32)
    x = torch.randn(9, 64, device="cuda")
    weights, ids = _routing(9, 16, 4)
    ids[::2, 1] = -1
    kept = ids >= 0
    ref = ex(x, weights * kept, torch.where(kept, ids, torch.zeros_like(ids)))
    torch.testing.assert_close(fused_experts(x, ex.w13, ex.w2, weights, ids), ref, rtol=1e-5, atol=1e-5)


def test_graph_replay_equals_eager():
    ex = _experts(32, 128, 64, torch.bfloat16)
    x = torch.randn(16, 128, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(16, 32, 4)
    fused_experts(x, ex.w13, ex.w2, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, ex.w13, ex.w2, weights, ids)
    new_w, new_ids = _routing(16, 32, 4)
    x.copy_(torch.randn_like(x))
    weights.copy_(new_w)
    ids.copy_(new_ids)
    graph.replay()
    torch.testing.assert_close(out, fused_experts(x, ex.w13, ex.w2, weights, ids), rtol=0, atol=0)


def test_engine_qwen3_moe_greedy_with_fused_moe_and_graphs(tmp_path):
    from tests.engine.test_engine_correctness import make_prompts
    from tokenspeed import Engine

    path = make_tiny_model("qwen3_moe", tmp_path)
    hf = load_hf_model(path).to("cuda")
    prompts = make_prompts(hf.config.vocab_size)
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    with Engine(
        model=path,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        sampling_backend="triton",
        moe_backend="triton",
        block_size=4,
        max_total_tokens=4096,
        cudagraph_capture_sizes=[1, 2, 4, 8],
    ) as engine:
        assert engine.core.runner.graph_runner is not None, "the fused MoE should make decode capturable"
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in outs] == expected
        assert_no_kv_leak(engine)
