"""On the GPU (not run in CPU CI): NGRAM and EAGLE3 greedy output equals plain greedy output with the
Triton and FlashInfer attention backends, with the verify steps replayed from CUDA graphs (laid out as a
decode of their tokens) whose graphs, with EAGLE3, also store the captured target states, and the
draft's own forwards replayed from its graphs; no KV page is held afterwards.

Triton runs float32 and must match plain decoding token for token. FlashInfer runs bfloat16 only (128-dim
heads): a verify step computes its rows in other GEMM shapes than plain decode, so bf16 rounding may flip a
rare near-tie and the bar is a share of agreeing tokens (as test_engine_gpu's graph-vs-eager test), while
a broken verify graph agrees on almost nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.eagle3_drafts import make_tiny_eagle3_draft
from tests.engine.test_speculative import make_prompts
from tests.gpu.test_engine_gpu import _agreement
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# 5 prompts x 4 tokens a verify = 20 rows: replayed in the 24-row graph (verify sizes 4, 8, 16, 32 added)
BASE = dict(
    device="cuda", block_size=4, max_total_tokens=4096, cudagraph_capture_sizes=[1, 2, 4, 8, 16, 24, 32]
)
BACKENDS = {
    "triton": (dict(dtype="float32"), {}),
    "flashinfer": (dict(dtype="bfloat16"), dict(head_dim=128, num_attention_heads=4, num_key_value_heads=1)),
}


@pytest.mark.parametrize("attention_backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("algo", ["NGRAM", "EAGLE3"])
def test_speculative_greedy_equals_plain_on_gpu(tmp_path, attention_backend, algo):
    if attention_backend == "flashinfer":
        pytest.importorskip("flashinfer")
    dtype, shape = BACKENDS[attention_backend]
    path = make_tiny_model("llama", tmp_path / "m", **shape)
    prompts = make_prompts()
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    kw = dict(model=path, attention_backend=attention_backend, **BASE, **dtype)
    with Engine(**kw) as plain:
        want = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    spec = dict(speculative_algorithm=algo, speculative_num_draft_tokens=4)
    if algo == "EAGLE3":
        spec["speculative_draft_model_path"] = make_tiny_eagle3_draft(path, Path(tmp_path) / "d", echo=True)
    with Engine(**kw, **spec) as engine:
        runner = engine.core.runner
        g = runner.graph_runner
        print(f"\n{algo}/{attention_backend}: target graphs {g and g.sizes} aux layers {g and g.aux_layers}")
        got = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        stats = engine.get_stats()
        use = runner.graph_use
        print(f"{algo}/{attention_backend}: {use}; drafts {stats.spec_num_drafts}, accepted "
              f"{stats.spec_num_accepted_tokens}, mean acceptance {stats.spec_mean_acceptance_length:.2f}")  # fmt: skip
        assert stats.spec_num_drafts > 0
        assert use.verify_replays > 0, f"no verify step replayed from a graph: {use}"
        if algo == "EAGLE3":
            proposer = engine.core.proposer
            assert proposer.graphs is not None, "the EAGLE3 draft has no CUDA graphs (see the log above)"
            # (its verify replays read the target states the graphs store; every step drafts, so plain
            # decode steps may not occur at all)
            assert use.draft_replays > 0, use
        assert_no_kv_leak(engine)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            n = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(f"prompt {i}: first difference at token {n}: spec {a[n : n + 4]} plain {b[n : n + 4]}")
    agreement = _agreement(got, want)
    print(f"{algo}/{attention_backend}: agreement with plain greedy {agreement:.3f} "
          f"({sum(a == b for a, b in zip(got, want, strict=True))}/{len(want)} outputs identical)")  # fmt: skip
    if attention_backend == "triton":
        assert got == want
    else:
        assert agreement >= 0.75
