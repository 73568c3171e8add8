"""On the GPU: greedy output of the Engine equals transformers generate() on tiny float32 models, with
the Triton attention backend and CUDA-graph decode, and graph replay gives the same tokens as eager."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_engine_correctness import greedy_references, make_prompts
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import ARCHS, load_hf_model, make_tiny_model
from tokenspeed import Engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MAX_NEW = 16
CONFIGS = {
    # decode through CUDA graphs (padding: 8 prompts replay the size-8 graph, then fewer as they stop)
    "graphs": dict(block_size=4, cudagraph_capture_sizes=[1, 2, 4, 8]),
    "eager": dict(block_size=4, enforce_eager=True),
    # the other configs overlap scheduling with the device (the default); this one steps synchronously
    "graphs_no_overlap": dict(
        block_size=4, cudagraph_capture_sizes=[1, 2, 4, 8], disable_overlap_schedule=True
    ),
    "chunked_mixed": dict(
        block_size=4,
        chunked_prefill_size=7,
        max_prefill_tokens=7,
        enable_mixed_batch=True,
        max_cudagraph_capture_size=16,
    ),
    "preemption": dict(
        block_size=4,
        max_total_tokens=64,
        enable_mixed_batch=True,
        chunked_prefill_size=16,
        max_cudagraph_capture_size=8,
    ),
    "flashinfer_sampler_greedy": dict(
        block_size=16, sampling_backend="flashinfer", max_cudagraph_capture_size=8
    ),
}
CASES = [(arch, c) for arch in ARCHS for c in CONFIGS]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return greedy_references(tmp_path_factory, MAX_NEW, "cuda")


@pytest.mark.parametrize("arch,config", CASES, ids=[f"{a}-{c}" for a, c in CASES])
def test_greedy_matches_transformers_on_gpu(references, arch, config):
    path, prompts, expected = references(arch)
    kwargs = {
        "max_total_tokens": 4096,
        "attention_backend": "triton",
        "sampling_backend": "triton",
        **CONFIGS[config],
    }
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    with Engine(model=path, device="cuda", dtype="float32", **kwargs) as engine:
        runner = engine.core.runner
        if config == "eager":
            assert runner.graph_runner is None
        else:
            assert runner.graph_runner is not None and runner.graph_runner.graphs
        for run in range(2):
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            for i, (out, ref) in enumerate(zip(outs, expected, strict=True)):
                assert out["output_ids"] == ref, (
                    f"{arch}/{config} run {run} prompt {i} (len {len(prompts[i])})"
                )
            assert_no_kv_leak(engine, flush=False)
        assert_no_kv_leak(engine)


def test_graph_replay_equals_eager_bf16(tmp_path):
    """bf16 Llama with 128-dim heads, flashinfer and triton: graph decode agrees with eager decode (padding
    to a captured size changes GEMM shapes, so bf16 rounding may flip a rare near-tie, hence a share, not
    equality; a broken graph agrees on almost nothing), and the two backends agree with each other."""
    path = make_tiny_model("llama", tmp_path, head_dim=128, num_attention_heads=4, num_key_value_heads=1)
    hf = load_hf_model(path)
    prompts = make_prompts(hf.config.vocab_size)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    outs = {}
    for backend in ("triton", "flashinfer"):
        for eager in (True, False):
            with Engine(
                model=path,
                device="cuda",
                dtype="bfloat16",
                attention_backend=backend,
                sampling_backend="greedy",
                enforce_eager=eager,
                max_total_tokens=4096,
                cudagraph_capture_sizes=[1, 2, 4, 8],
            ) as engine:
                outs[backend, eager] = [
                    o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)
                ]
        assert _agreement(outs[backend, True], outs[backend, False]) >= 0.75, backend
    assert _agreement(outs["triton", True], outs["flashinfer", True]) >= 0.6


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions, up to each pair's first difference, where the two runs agree."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        same += n
        total += max(len(x), len(y))
    return same / max(1, total)


def test_two_starts_give_the_same_greedy_tokens_on_tuned_shapes():
    """Llama-3.1-8B's shapes cut to two layers (dummy bf16 weights): its o, down and LM head take the dense GEMV
    at one row with the configuration the H200's tuned table ships, so two Engines started one after the
    other compute the same bits and decode the same greedy tokens, one request at a time. (With the
    configuration autotuned in each process, two starts could pick different ones, which sum K in another
    order; random bf16 weights have near-ties that such a change flips.)"""
    from benchmarks import gpu_common as gc
    from tokenspeed.runtime.kernels.gemv_table import table_for_device

    table = table_for_device(torch.cuda.get_device_name(0))
    if table.config_for(4096, 14336, torch.bfloat16, 1) is None:
        pytest.skip(f"no tuned dense GEMV configuration ships for {torch.cuda.get_device_name(0)}")
    model_dir = gc.write_config({**gc.LLAMA_8B, "num_hidden_layers": 2}, "llama8b-2layers")
    prompts = [[(7 * i + 3 * j) % 1000 + 5 for j in range(40 + 9 * i)] for i in range(4)]
    params = {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True}
    runs = []
    for _ in range(2):
        with Engine(model=model_dir, load_format="dummy", dtype="bfloat16", device="cuda", skip_tokenizer_init=True,
                    max_model_len=1024, max_total_tokens=8192, cudagraph_capture_sizes=[1, 2, 4]) as engine:  # fmt: skip
            runs.append(
                [engine.generate(input_ids=[p], sampling_params=params)[0]["output_ids"] for p in prompts]
            )
    for i, (a, b) in enumerate(zip(*runs, strict=True)):
        at = next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        print(
            f"request {i}: {'the same' if at is None else f'first differs at token {at}: {a[at : at + 4]} vs {b[at : at + 4]}'}"
        )
    assert runs[0] == runs[1]
