"""CPU-side rules of the GPU fast path: CUDA-graph capture sizes and padding, when graphs are off, the
graph memory held back, the default attention backend, and the sampling parameters and `*_full`
adjustments that the GPU samplers build on the host."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from tokenspeed.config import memory_model
from tokenspeed.config.slices import GraphConfig
from tokenspeed.runtime.execution import cuda_graph
from tokenspeed.runtime.layers.attention.backend import default_attention_backend
from tokenspeed.runtime.layers.sampling.gpu_params import SamplingTensors, apply_full_adjustments, row_seed
from tokenspeed.runtime.layers.sampling.penalties import apply_penalties
from tokenspeed.sampling_params import SamplingParams


def test_capture_sizes_ladder_and_explicit():
    assert memory_model.capture_sizes(None, 40, 256) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert memory_model.capture_sizes(None, 20, 256) == [1, 2, 4, 8, 16, 20]
    assert memory_model.capture_sizes(None, None, 1000)[-1] == memory_model.DEFAULT_MAX_CAPTURE_SIZE
    # never above what the scheduler can run at once
    assert memory_model.capture_sizes(None, 160, 12) == [1, 2, 4, 8]
    assert memory_model.capture_sizes([8, 1, 3, 3], 160, 256) == [1, 3, 8]
    with pytest.raises(ValueError, match="cudagraph-capture-sizes"):
        memory_model.capture_sizes([0, 4], None, 256)
    with pytest.raises(ValueError, match="max-cudagraph-capture-size"):
        memory_model.capture_sizes(None, 0, 256)


def _runner_stub(sizes, pad):
    runner = cuda_graph.CudaGraphRunner.__new__(cuda_graph.CudaGraphRunner)
    runner.sizes, runner.pad = sorted(sizes), pad
    return runner


def test_padding_picks_next_size_unless_disabled():
    padded = _runner_stub([1, 2, 4, 8], pad=True)
    assert [padded.padded_size(b) for b in (1, 3, 5, 8, 9)] == [1, 4, 8, 8, None]
    exact = _runner_stub([1, 2, 4, 8], pad=False)
    assert [exact.padded_size(b) for b in (1, 3, 8)] == [1, None, 8]


def test_graphs_off_on_cpu_with_enforce_eager_or_torch_backend():
    graphs = GraphConfig(max_capture_size=16)
    assert cuda_graph.decode_graph_sizes(graphs, torch.device("cpu"), "triton", 64) is None
    assert cuda_graph.decode_graph_sizes(graphs, torch.device("cuda"), "torch", 64) is None
    assert cuda_graph.decode_graph_sizes(graphs, torch.device("cuda"), "triton", 64) == [1, 2, 4, 8, 16]
    eager = GraphConfig(enforce_eager=True, max_capture_size=16)
    assert cuda_graph.decode_graph_sizes(eager, torch.device("cuda"), "triton", 64) is None


def test_graph_memory_reserve_grows_with_batch_and_counts_flashinfer_workspace():
    cfg = SimpleNamespace(hidden_size=4096, intermediate_size=14336, vocab_size=128256, dtype=torch.bfloat16)
    small, large = (
        cuda_graph.decode_graph_reserve(cfg, [8], "triton"),
        cuda_graph.decode_graph_reserve(cfg, [256], "triton"),
    )
    assert 0 < small < large
    # logits alone (float32) of the largest batch fit in the reserve
    assert large > 256 * 128256 * 4
    assert cuda_graph.decode_graph_reserve(cfg, None, "triton") == 0
    assert cuda_graph.decode_graph_reserve(cfg, None, "flashinfer") == 256 << 20


def test_default_attention_backend():
    assert default_attention_backend("cpu", torch.float32) == "torch"
    assert default_attention_backend("cuda", torch.bfloat16) == "triton"
    assert default_attention_backend("cuda", torch.float32) == "triton"


def _req(prompt=(1, 2, 3), output=(), **sp):
    ids = list(prompt) + list(output)
    return SimpleNamespace(
        sampling=SamplingParams(**sp),
        token_ids=ids,
        num_prompt_tokens=len(prompt),
        num_output_tokens=len(output),
    )


def test_sampling_tensors_and_seeds():
    reqs = [_req(temperature=0.0), _req(top_k=5, seed=7, output=(4,)), _req(top_p=0.9, min_p=0.1)]
    t = SamplingTensors.build(reqs, torch.device("cpu"), random.Random(0), with_min_p=True)
    assert t.temperature.tolist() == [0.0, 1.0, 1.0]
    assert t.top_k.tolist() == [-1, 5, -1]
    assert t.min_p.tolist() == pytest.approx([0.0, 0.0, 0.1])
    assert not t.all_greedy and t.needs_filter
    assert t.seeds[1].item() == row_seed(7, 1)
    without = SamplingTensors.build(reqs, torch.device("cpu"), random.Random(0), with_min_p=False)
    assert without.min_p.tolist() == [0.0, 0.0, 0.0]
    # same seed, same position -> same key; another position -> another key
    assert row_seed(7, 1) == row_seed(7, 1) != row_seed(7, 2)
    assert SamplingTensors.build(
        [_req(temperature=0.0)], torch.device("cpu"), random.Random(0), True
    ).all_greedy


def test_full_adjustments_equal_torch_penalties_and_add_logit_bias():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    reqs = [
        _req(prompt=(1, 2), output=(3, 3, 4), frequency_penalty=0.7, presence_penalty=0.3),
        _req(prompt=(5, 6, 7), output=(8,), repetition_penalty=1.8),
        _req(),
    ]
    torch.testing.assert_close(apply_full_adjustments(logits, reqs), apply_penalties(logits, reqs))
    reqs[2].sampling.logit_bias = {"9": 5.0, 49: -3.0, 1000: 1.0}  # out-of-vocab ids are ignored
    before = logits.clone()
    out = apply_full_adjustments(logits, reqs)
    assert out[2, 9] == pytest.approx(logits[2, 9] + 5.0)
    assert out[2, 49] == pytest.approx(logits[2, 49] - 3.0)
    assert torch.equal(logits, before)  # the input is left untouched
