"""On the GPU (not run in CPU CI): NGRAM and EAGLE3 greedy output equals plain greedy output with the
Triton and FlashInfer attention backends, CUDA-graph decode for the plain steps (drafted verify steps and
the draft's own forwards run eagerly), and no KV page held afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.eagle3_drafts import make_tiny_eagle3_draft
from tests.engine.test_speculative import make_prompts
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BASE = dict(device="cuda", dtype="float32", block_size=4, max_total_tokens=4096, cudagraph_capture_sizes=[1, 2, 4, 8])


@pytest.mark.parametrize("attention_backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("algo", ["NGRAM", "EAGLE3"])
def test_speculative_greedy_equals_plain_on_gpu(tmp_path, attention_backend, algo):
    if attention_backend == "flashinfer":
        pytest.importorskip("flashinfer")
    path = make_tiny_model("llama", tmp_path / "m")
    prompts = make_prompts()
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    with Engine(model=path, attention_backend=attention_backend, **BASE) as plain:
        want = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    spec = dict(speculative_algorithm=algo, speculative_num_draft_tokens=4)
    if algo == "EAGLE3":
        spec["speculative_draft_model_path"] = make_tiny_eagle3_draft(path, Path(tmp_path) / "d", echo=True)
    with Engine(model=path, attention_backend=attention_backend, **BASE, **spec) as engine:
        got = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        assert engine.get_stats().spec_num_drafts > 0
        assert_no_kv_leak(engine)
    assert got == want
