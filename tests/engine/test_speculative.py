"""Speculative decoding gives exactly the outputs of plain decoding, and holds no KV page afterwards.

Tiny random Llama and Qwen3 models; prompts built with repeated runs of tokens so prompt lookup (NGRAM)
finds drafts and random models' loops get accepted. EAGLE3 runs random drafts written in the Hugging Face
layout (tests/eagle3_drafts.py): one with a small draft vocabulary and its d2t map, and an "echo" draft
whose proposals the target accepts where it repeats itself; the trained `demo` draft, where it ships, must
also reach an acceptance length above 1. Greedy output with drafts equals greedy output without,
token for token, under the scheduling regimes of the correctness tests (chunked prefill with mixed batches,
a KV pool so small that requests are preempted), twice (the second pass over cached prefixes). Stop tokens
and max_new_tokens inside an accepted run, streaming, n > 1, seeded sampling and aborts mid-speculation are
checked on the same engines; after every run no KV page is held.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest

from tests.eagle3_drafts import make_tiny_eagle3_draft
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine
from tokenspeed.runtime.engine.io_struct import GenerateRequest

MAX_NEW = 16
ARCHS = ("llama", "qwen3")
CONFIGS = {
    "default": dict(block_size=4, max_total_tokens=2048),
    "chunked_mixed": dict(
        block_size=4, max_total_tokens=2048, chunked_prefill_size=7, max_prefill_tokens=7, enable_mixed_batch=True
    ),
    "preemption": dict(block_size=4, max_total_tokens=96, enable_mixed_batch=True, chunked_prefill_size=16),
}
NGRAM = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
pytestmark = pytest.mark.usefixtures("one_thread")
LOGPROBS = {"logprobs": True, "top_logprobs": 2}
LOGPROB_REFS: dict[str, list[dict]] = {}  # arch -> plain greedy meta_info with logprobs


def make_prompts(seed: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for n in (3, 9, 14, 22, 30):
        unit = [rng.randrange(5, 200) for _ in range(rng.randrange(2, 6))]
        body = [rng.randrange(5, 200) for _ in range(n)]
        prompts.append(body[: n // 2] + unit * 3 + body[n // 2 :] + unit[:2])
    return prompts


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (model folder, prompts, plain greedy outputs), built lazily; the folder also holds two
    EAGLE3 drafts, draft-random and draft-echo."""
    cache: dict[str, tuple[str, list[list[int]], list[list[int]]]] = {}

    def get(arch: str):
        if arch not in cache:
            path = make_tiny_model(arch, tmp_path_factory.mktemp(arch))
            make_tiny_eagle3_draft(path, Path(path) / "draft-random", seed=1)
            make_tiny_eagle3_draft(path, Path(path) / "draft-echo", echo=True)
            prompts = make_prompts()
            params = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
            with Engine(model=path, device="cpu", dtype="float32", **CONFIGS["default"]) as plain:
                ref = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
                lps = plain.generate(input_ids=prompts, sampling_params={**params, **LOGPROBS})
            LOGPROB_REFS[arch] = [o["meta_info"] for o in lps]
            cache[arch] = (path, prompts, ref)
        return cache[arch]

    return get


def spec_engine(path: str, config: str = "default", algo: str = "NGRAM", **extra) -> Engine:
    if algo == "NGRAM":
        spec = NGRAM
    else:  # draft-random / draft-echo
        spec = dict(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=str(Path(path) / algo),
            speculative_num_steps=3,
        )
    return Engine(model=path, device="cpu", dtype="float32", **CONFIGS[config], **spec, **extra)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_ngram_greedy_equals_plain(models, arch, config):
    path, prompts, ref = models(arch)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
    with spec_engine(path, config) as engine:
        assert not engine.core.overlap
        for run in range(2):
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            for i, (out, want) in enumerate(zip(outs, ref, strict=True)):
                assert out["output_ids"] == want, f"{arch}/{config} run {run} prompt {i}"
                assert out["meta_info"]["completion_tokens"] == MAX_NEW
            assert_no_kv_leak(engine, flush=False)
        if config == "default":
            # logprobs of tokens accepted from drafts are the target's own, as without drafts
            params = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True, **LOGPROBS}
            for out, want in zip(engine.generate(input_ids=prompts, sampling_params=params), LOGPROB_REFS[arch],
                                 strict=True):  # fmt: skip
                got = out["meta_info"]
                assert [t for _, t, _ in got["output_token_logprobs"]] == [t for _, t, _ in want["output_token_logprobs"]]
                assert [lp for lp, _, _ in got["output_token_logprobs"]] == pytest.approx(
                    [lp for lp, _, _ in want["output_token_logprobs"]], abs=1e-4
                )
                assert [[t for _, t, _ in a] for a in got["output_top_logprobs"]] == [
                    [t for _, t, _ in a] for a in want["output_top_logprobs"]
                ]
        stats = engine.get_stats()
        assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens > 0, stats
        assert stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
        assert stats.spec_mean_acceptance_length > 1.0
        if config == "preemption":
            assert stats.num_preemptions > 0
        assert_no_kv_leak(engine)


def test_stops_inside_an_accepted_run_and_streaming(models):
    """A stop token or max_new_tokens inside a run ends the request there: later tokens are never shown.
    Streamed chunks add up to the non-streamed answer, and a verify step's tokens arrive together."""
    path, prompts, ref = models("llama")
    free = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
    params, expected = [], []
    for i, out in enumerate(ref):
        stop = out[min(2 + i, len(out) - 1)]
        params.append({**free, "stop_token_ids": [stop]})
        expected.append(out[: out.index(stop) + 1])
    params[0] = {**free, "max_new_tokens": 5}
    expected[0] = ref[0][:5]
    with spec_engine(path) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in outs] == expected
        chunks: dict[int, list[list[int]]] = defaultdict(list)
        for upd in engine.generate(input_ids=prompts, sampling_params=free, stream=True):
            chunks[upd["index"]].append(upd["output_ids"])
        for i, cs in chunks.items():
            assert [t for c in cs for t in c] == ref[i]
        assert any(len(c) > 1 for cs in chunks.values() for c in cs), "no step emitted several tokens"
        assert_no_kv_leak(engine)


def test_seeded_sampling_and_n(models):
    """Seeded sampling with drafts is reproducible; n > 1 gives n answers; penalties and logprobs run."""
    path, prompts, _ = models("qwen3")
    params = {
        "max_new_tokens": 12,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 3,
        "ignore_eos": True,
        "repetition_penalty": 1.1,
        "logprobs": True,
    }
    with spec_engine(path) as engine:
        a = engine.generate(input_ids=prompts, sampling_params=params)
        b = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in a] == [o["output_ids"] for o in b]
        many = engine.generate(input_ids=prompts[3], sampling_params={**params, "n": 3, "seed": None})
        assert len(many) == 3 and all(len(o["output_ids"]) == 12 for o in many)
        assert_no_kv_leak(engine)


def test_abort_mid_speculation_leaks_nothing(models):
    path, prompts, _ = models("llama")
    with spec_engine(path, "preemption") as engine:
        core = engine.core
        sampling = {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True}
        for i, p in enumerate(prompts):
            core.add_request(GenerateRequest(f"r{i}", p, sampling, stream=True))
        finished = set()
        for step in range(400):
            for o in core.step():
                if o.finished:
                    finished.add(o.rid)
            if step == 6:
                assert core.spec_stats.num_drafts > 0, "drafts were expected by now"
                for rid in ("r0", "r2", "r4"):
                    core.abort_request(rid)
            if not core.has_unfinished():
                break
        assert finished == {f"r{i}" for i in range(len(prompts))}
        assert_no_kv_leak(engine)


EAGLE_CASES = [
    ("llama", "default", "draft-random"),
    ("llama", "chunked_mixed", "draft-echo"),
    ("qwen3", "default", "draft-echo"),
    ("qwen3", "preemption", "draft-random"),
]


@pytest.mark.parametrize("arch,config,draft", EAGLE_CASES, ids=["-".join(c) for c in EAGLE_CASES])
def test_eagle3_greedy_equals_plain(models, arch, config, draft):
    path, prompts, ref = models(arch)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
    with spec_engine(path, config, draft) as engine:
        assert engine.core.proposer.layers  # the draft config has no layer ids here: EAGLE3's default
        for run in range(2):
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            for i, (out, want) in enumerate(zip(outs, ref, strict=True)):
                assert out["output_ids"] == want, f"{arch}/{config}/{draft} run {run} prompt {i}"
            assert_no_kv_leak(engine, flush=False)
        stats = engine.get_stats()
        assert stats.spec_num_drafts > 0 and stats.spec_num_draft_tokens >= 3 * stats.spec_num_drafts // 2
        if draft == "draft-echo" and any(a == b for r in ref for a, b in zip(r, r[1:], strict=False)):
            assert stats.spec_num_accepted_tokens > 0, "the echo draft should be accepted on repeats"
        if config == "preemption":
            assert stats.num_preemptions > 0
        assert_no_kv_leak(engine)


def test_eagle3_sampling_stops_and_aborts(models):
    """Seeded sampling with EAGLE3 drafts is reproducible; stop tokens inside runs end answers; requests
    aborted mid-speculation leave no page held."""
    path, prompts, ref = models("llama")
    with spec_engine(path, "preemption", "draft-echo") as engine:
        params = {"max_new_tokens": 12, "temperature": 0.7, "seed": 9, "ignore_eos": True}
        a = engine.generate(input_ids=prompts, sampling_params=params)
        b = engine.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in a] == [o["output_ids"] for o in b]
        stops = [{"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True, "stop_token_ids": [o[3]]}
                 for o in ref]  # fmt: skip
        outs = engine.generate(input_ids=prompts, sampling_params=stops)
        assert [o["output_ids"] for o in outs] == [r[: r.index(r[3]) + 1] for r in ref]
        core = engine.core
        greedy = {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True}
        for i, p in enumerate(prompts):
            core.add_request(GenerateRequest(f"e{i}", p, greedy))
        for step in range(400):
            core.step()
            if step == 8:
                for rid in ("e1", "e3"):
                    core.abort_request(rid)
            if not core.has_unfinished():
                break
        assert not core.has_unfinished()
        assert_no_kv_leak(engine)


def test_stop_string_inside_an_accepted_run():
    """A stop string found in the text of a multi-token step ends the answer where plain decoding ends it:
    same text, same finish reason, same token count (the tokens after it are not counted)."""
    prompt = "To open a file, use the open function. To open a file, use the open function. To open a file,"
    params = {"max_new_tokens": 40, "temperature": 0.0, "stop": ["mode"]}
    with Engine(model="demo", device="cpu") as plain:
        want = plain.generate(prompt, sampling_params=params)
    with Engine(model="demo", device="cpu", **NGRAM) as engine:
        got = engine.generate(prompt, sampling_params=params)
        assert engine.get_stats().spec_num_accepted_tokens > 0
    assert want["meta_info"]["finish_reason"] == {"type": "stop", "matched": "mode"}
    assert got["text"] == want["text"] and got["output_ids"] == want["output_ids"]
    assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    assert got["meta_info"]["completion_tokens"] == want["meta_info"]["completion_tokens"]


DEMO_DRAFT = Path(__file__).resolve().parents[2] / "tokenspeed" / "assets" / "demo-eagle3"


@pytest.mark.skipif(not (DEMO_DRAFT / "config.json").is_file(), reason="the demo EAGLE3 draft is not shipped")
def test_demo_draft_equals_plain_greedy_and_is_accepted():
    prompts = ["To open a file,", "When an exception is raised", "The dictionary maps"]
    params = {"max_new_tokens": 48, "temperature": 0.0}
    with Engine(model="demo", device="cpu") as plain:
        want = [o["output_ids"] for o in plain.generate(prompts, sampling_params=params)]
    with Engine(
        model="demo", device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path=str(DEMO_DRAFT)
    ) as engine:
        got = [o["output_ids"] for o in engine.generate(prompts, sampling_params=params)]
        stats = engine.get_stats()
    assert got == want
    assert stats.spec_mean_acceptance_length > 1.0, stats
