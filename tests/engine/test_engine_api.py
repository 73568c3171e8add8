"""The offline Engine and EngineCore as a user drives them: shapes, streaming, stops, errors, aborts, cache."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.engine.streams import collect_stream
from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine, SamplingParams
from tokenspeed.runtime.engine.io_struct import GenerateRequest

GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
# Tiny models run fastest on one thread; more only spin against each other on a busy 2-core box.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def engine(model_path):
    with Engine(model=model_path, block_size=4, max_total_tokens=1024, max_model_len=256) as e:
        yield e


@pytest.fixture(autouse=True)
def no_leak(request):
    yield
    if "engine" in request.fixturenames:
        assert_no_kv_leak(request.getfixturevalue("engine"), flush=False)


def test_text_prompts_and_result_shape(engine):
    one = engine.generate("The quick brown fox", GREEDY)
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    assert meta["prompt_tokens"] == len(engine.tokenizer.encode("The quick brown fox"))
    assert meta["completion_tokens"] == 12 == len(one["output_ids"])
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert one["text"] == engine.tokenizer.decode(one["output_ids"], skip_special_tokens=True)
    many = engine.generate(["The quick brown fox", "Hello"], SamplingParams(**GREEDY))
    assert isinstance(many, list) and len(many) == 2
    assert many[0]["output_ids"] == one["output_ids"]  # batching does not change greedy output


def test_stream_yields_increments_that_add_up(engine):
    full = engine.generate(["Once upon a time", "Hello, world"], GREEDY)
    text, ids, finished = collect_stream(engine, ["Once upon a time", "Hello, world"], GREEDY)
    assert ids == [f["output_ids"] for f in full] and text == [f["text"] for f in full]
    assert finished == [{"type": "length", "length": 12}] * 2


def test_closing_a_stream_early_aborts_its_requests(engine):
    stream = engine.generate("Hello", {"max_new_tokens": 50, "ignore_eos": True}, stream=True)
    next(stream)
    stream.close()
    assert not engine.core.has_unfinished()


def test_stop_token_ids_and_stop_strings(engine):
    base = engine.generate("She sells sea shells", GREEDY)
    ids = base["output_ids"]
    stop_id = ids[4]
    out = engine.generate("She sells sea shells", {**GREEDY, "stop_token_ids": [stop_id]})
    assert out["output_ids"] == ids[: ids.index(stop_id) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    text = base["text"]
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip())
    out = engine.generate("She sells sea shells", {**GREEDY, "stop": [stop]})
    assert out["text"] == text[: text.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["meta_info"]["completion_tokens"] < 12


def test_max_new_tokens_zero_and_n_samples(engine):
    out = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    outs = engine.generate(
        input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 8, "n": 3, "seed": 3, "temperature": 2}
    )
    assert len(outs) == 3 and len({tuple(o["output_ids"]) for o in outs}) > 1


def test_prompt_longer_than_the_context_is_a_clear_error(engine):
    with pytest.raises(ValueError, match=r"300 tokens; this server accepts at most 255 \(max model length 256"):
        engine.generate(input_ids=list(range(5, 305)), sampling_params=GREEDY)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        engine.generate("hi", {"max_tokens": 3})
    # The engine still serves afterwards.
    assert engine.generate("hi", GREEDY)["meta_info"]["completion_tokens"] == 12


def test_core_abort_stop_reason_and_stats(engine):
    core = engine.core
    for rid in ("a", "b"):
        core.add_request(
            GenerateRequest(
                rid, [9, 10, 11, 12, 13], {"max_new_tokens": 100, "ignore_eos": True}, stream=True
            )
        )
    with pytest.raises(ValueError, match="already running"):
        core.add_request(GenerateRequest("a", [1, 2], {}))
    outs = core.step() + core.step()
    assert {o.rid for o in outs} == {"a", "b"} and not any(o.finished for o in outs)
    snap = core.stats()
    assert snap.num_running == 2 and snap.kv_pages_used > 0 and snap.kv_pages_total == 256
    assert not core.flush_cache()  # refused while requests run
    assert core.abort_request("a") and core.abort_request("b", reason="stop")
    finals = {o.rid: o for o in core.step()}
    assert finals["a"].finish_reason == "abort" and finals["b"].finish_reason == "stop"
    # The abort reports exactly the tokens already streamed (with overlap scheduling, a token still in
    # flight at the abort is dropped, never shown).
    streamed_a = sum(len(o.new_token_ids) for o in outs if o.rid == "a")
    assert finals["a"].finished and finals["a"].completion_tokens == streamed_a >= 1
    assert finals["a"].new_token_ids == []
    assert not core.has_unfinished() and not core.abort_request("a")
    with pytest.raises(ValueError, match="abort reason"):
        core.abort_request("x", reason="bogus")


def test_non_streaming_core_requests_report_once(engine):
    core = engine.core
    core.add_request(GenerateRequest("quiet", [9, 10, 11], {"max_new_tokens": 4, "ignore_eos": True}))
    outs = []
    while core.has_unfinished():
        outs += core.step()
    assert len(outs) == 1 and outs[0].finished and len(outs[0].new_token_ids) == 4


def test_shared_prefix_workload_hits_the_cache_and_computes_less(model_path):
    system = list(range(20, 84))  # a 64-token shared system prompt
    prompts = [system + [100 + i, 200 + i, 300 - i] for i in range(8)]
    results, computed, hits = {}, {}, {}
    for caching in (True, False):
        with Engine(
            model=model_path,
            block_size=4,
            max_total_tokens=2048,
            chunked_prefill_size=32,
            max_prefill_tokens=32,
            enable_prefix_caching=caching,
        ) as e:
            first = e.generate(input_ids=prompts[:1], sampling_params=GREEDY)
            rest = e.generate(input_ids=prompts[1:], sampling_params=GREEDY)
            results[caching] = [o["output_ids"] for o in first + rest]
            stats = e.get_stats()
            computed[caching] = sum(stats.iteration_tokens)
            hits[caching] = (stats.prefix_cache_hits, stats.prefix_cache_queries)
            cached = [o["meta_info"]["cached_tokens"] for o in rest]
            assert all(c == 64 for c in cached) if caching else not any(cached)
            assert_no_kv_leak(e)
    assert results[True] == results[False]
    assert hits[True][0] >= 7 * 64 and hits[False][0] == 0
    assert hits[True][1] == hits[False][1] == 8 * 67
    assert computed[True] <= computed[False] - 7 * 64


def test_skip_tokenizer_init_takes_token_ids(model_path):
    with Engine(model=model_path, block_size=4, max_total_tokens=256, skip_tokenizer_init=True) as e:
        out = e.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)
        assert out["text"] == "" and len(out["output_ids"]) == 12
        with pytest.raises(ValueError, match="input_ids"):
            e.generate("text")


def test_import_tokenspeed_stays_light():
    code = (
        "import sys, tokenspeed; assert 'torch' not in sys.modules; print(tokenspeed.SamplingParams().top_k)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "-1"


def test_logprobs_of_the_chosen_tokens(engine):
    out = engine.generate(input_ids=[5, 6, 7], sampling_params={**GREEDY, "logprobs": True})
    lps = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    assert all(lp <= 0.0 for lp, _, _ in lps) and any(lp < 0.0 for lp, _, _ in lps)
    assert (
        "output_token_logprobs"
        not in engine.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)["meta_info"]
    )


def test_stats_report_throughput(engine):
    engine.generate(input_ids=[[5, 6, 7]] * 4, sampling_params=GREEDY)
    snap = engine.get_stats()
    assert snap.gen_throughput > 0 and snap.kv_pages_used == 0 and snap.block_size == 4
    assert engine.get_stats().gen_throughput > 0  # a rate over recent seconds, not reset by reading it
