"""Structured output, logit bias and top logprobs on the GPU: the bitmask and the bias are applied inside
the sampling step of every GPU sampling backend, with overlap scheduling and CUDA graphs on (the GPU
defaults), and the constrained outputs match their constraints."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tokenspeed import Engine
from tokenspeed.demo_models import DEMO_MODELS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"enum": ["x", "y"]}},
    "required": ["id", "tag"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("backend", ["torch", "triton", "triton_full", "flashinfer"])
def test_constraints_bias_and_top_logprobs_on_cuda(backend):
    if backend.startswith("flashinfer"):
        pytest.importorskip("flashinfer")
    with Engine(
        model=str(DEMO_MODELS[0].path), grammar_backend="xgrammar", disable_any_whitespace=True,
        sampling_backend=backend, enable_output_logprobs=True,
    ) as engine:  # fmt: skip
        assert engine.core.overlap
        prompts = ["Hello there", "In Python", "Data:", "The capital of France is"] * 8
        kinds = [{"json_schema": json.dumps(SCHEMA)}, {"regex": "[a-z]{3}-[0-9]{2}"}, {}, {}] * 8
        params = [{"max_new_tokens": 32, "temperature": 1.0, "seed": i, **k} for i, k in enumerate(kinds)]
        outs = engine.generate(prompt=prompts, sampling_params=params)
        for i, out in enumerate(outs):
            if i % 4 == 0:
                value = json.loads(out["text"])
                assert set(value) == {"id", "tag"} and value["tag"] in ("x", "y")
            elif i % 4 == 1:
                assert re.fullmatch("[a-z]{3}-[0-9]{2}", out["text"]), out["text"]
        base = {"max_new_tokens": 1, "temperature": 0.0}
        (greedy,) = engine.generate(prompt=["The capital of France is"], sampling_params=base)
        tok = greedy["output_ids"][0]
        (banned,) = engine.generate(
            prompt=["The capital of France is"], sampling_params={**base, "logit_bias": {tok: -100}}
        )
        (forced,) = engine.generate(
            prompt=["The capital of France is"],
            sampling_params={**base, "temperature": 1.0, "logit_bias": {42: 100}},
        )
        assert banned["output_ids"][0] != tok and forced["output_ids"][0] == 42


@pytest.mark.parametrize("backend", ["torch", "triton", "triton_full"])
def test_sampler_top_logprobs_and_bitmask_on_cuda(backend):
    from types import SimpleNamespace

    from tokenspeed.runtime.layers.sampling import create_sampler
    from tokenspeed.sampling_params import SamplingParams

    torch.manual_seed(0)
    logits = torch.randn(3, 1000, device="cuda")
    reqs = [
        SimpleNamespace(
            sampling=SamplingParams(temperature=1.0, logprobs=True, top_logprobs=5, logit_bias={7: 3.0}),
            generator=None,
            token_ids=[1, 2],
            eos_token_ids=frozenset(),
            num_prompt_tokens=2,
            num_output_tokens=0,
        )  # fmt: skip
        for _ in range(3)
    ]
    bitmask = torch.zeros(3, (1000 + 31) // 32, dtype=torch.int32, device="cuda")
    bitmask[:, 0] = 0b1111_0000  # tokens 4..7 only
    out = create_sampler(backend, "cuda").sample(logits, reqs, bitmask)
    assert set(out.token_ids.tolist()) <= {4, 5, 6, 7}
    ref = logits.double().clone()
    ref[:, 7] += 3.0
    ref[:, [i for i in range(1000) if i not in (4, 5, 6, 7)]] = float("-inf")
    ref = torch.log_softmax(ref, dim=-1)
    want_lp, want_ids = ref.topk(4)
    assert torch.equal(out.top_ids[:, :4].cpu(), want_ids.cpu())
    assert torch.allclose(out.top_logprobs[:, :4].double().cpu(), want_lp.cpu(), atol=1e-4)
    chosen = ref.gather(1, out.token_ids.unsqueeze(1).cpu().to(ref.device)).squeeze(1)
    assert torch.allclose(out.logprobs.double(), chosen, atol=1e-4)
