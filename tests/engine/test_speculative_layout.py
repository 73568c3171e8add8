"""The layout CUDA graphs replay speculative steps in, checked on the CPU: a verify step laid out as a decode
of its tokens (one row per token: the request's table row repeated, seq_len = position + 1), and an EAGLE3
draft's catch-up and chain forwards laid out the same way, give exactly the greedy output of plain
decoding. On the GPU these layouts run from the decode graphs (tests/gpu/test_speculative_gpu.py); here
the runner and the proposer are told to use them eagerly with the torch attention backend, so an error in
the rows, positions, slots or lengths shows as a different token."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eagle3_drafts import make_tiny_eagle3_draft
from tests.engine.test_speculative import CONFIGS as SPEC_CONFIGS
from tests.engine.test_speculative import make_prompts
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine
from tokenspeed.runtime.engine.io_struct import GenerateRequest

pytestmark = pytest.mark.usefixtures("one_thread")
# as test_speculative: chunked+mixed puts prefill chunks beside drafted decodes (those steps keep the extend
# layout), preemption recomputes requests mid-speculation
CONFIGS = SPEC_CONFIGS
PARAMS = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = make_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    draft = make_tiny_eagle3_draft(path, Path(path) / "draft-echo", echo=True)
    prompts = make_prompts()
    with Engine(model=path, device="cpu", dtype="float32", **CONFIGS["default"]) as plain:
        ref = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=PARAMS)]
    return path, draft, prompts, ref


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("algo", ["NGRAM", "EAGLE3"])
def test_decode_layout_of_speculative_steps_equals_plain(llama, algo, config):
    path, draft, prompts, ref = llama
    spec = dict(speculative_algorithm=algo, speculative_num_draft_tokens=4)
    if algo == "EAGLE3":
        spec["speculative_draft_model_path"] = draft
    with Engine(model=path, device="cpu", dtype="float32", **CONFIGS[config], **spec) as engine:
        runner = engine.core.runner
        runner.force_verify_as_decode = True
        if algo == "EAGLE3":
            engine.core.proposer.force_flat = True
        outs = engine.generate(input_ids=prompts, sampling_params=PARAMS)
        for i, (out, want) in enumerate(zip(outs, ref, strict=True)):
            assert out["output_ids"] == want, f"{algo}/{config} prompt {i}"
        stats = engine.get_stats()
        assert stats.spec_num_accepted_tokens > 0, stats
        use = runner.graph_use
        # every verify step ran eagerly (no graphs on the CPU), most of them in the decode layout
        assert use.verify_replays == 0 and use.verify_eager >= stats.spec_num_drafts // len(prompts), use
        assert_no_kv_leak(engine)


def test_flat_draft_forwards_propose_the_same_drafts(llama, tmp_path):
    """A random draft (whose proposals depend on its attention over its own KV): the flat layout of its
    catch-up and chain forwards proposes the same draft tokens as the extend layout, step by step."""
    path, _, prompts, _ = llama
    draft = make_tiny_eagle3_draft(path, tmp_path / "draft-random", seed=1, draft_vocab_size=None)
    spec = dict(
        speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_draft_tokens=4
    )
    kw = dict(model=path, device="cpu", dtype="float32", **CONFIGS["chunked_mixed"], **spec)
    with Engine(**kw) as extend, Engine(**kw) as flat:
        flat.core.proposer.force_flat = True
        cores = (extend.core, flat.core)
        for core in cores:
            for i, p in enumerate(prompts):
                core.add_request(GenerateRequest(f"r{i}", p, dict(PARAMS)))
        compared = 0
        for _ in range(200):
            for core in cores:
                core.step()
            drafts = [
                {rid: list(r.draft_ids) for rid, r in core.scheduler.requests.items()} for core in cores
            ]
            assert drafts[0] == drafts[1]
            compared += sum(len(d) for d in drafts[0].values())
            if not any(core.has_unfinished() for core in cores):
                break
        assert compared > 50, compared
        assert flat.core.runner.graph_use.draft_eager > 0
