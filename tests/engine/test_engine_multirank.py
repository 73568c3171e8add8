"""The offline Engine with several ranks: real scheduler processes over gloo on the CPU.

Engine(tp_size=2) on a tiny Llama and Engine(tp_size=2, ep_size=2) on a tiny Qwen3-MoE must give the
single-rank Engine's greedy tokens; streaming, stop strings and early-closed streams behave as with one
rank; a rank that dies raises a clear error; nothing is left running after shutdown(), after the Engine is
garbage collected, or after the interpreter exits without a shutdown; data parallel is refused by name.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.engine.streams import collect_stream
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine
from tokenspeed.runtime.entrypoints.rank_client import RanksDied

GREEDY = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
PROMPTS = [[5, 6, 7, 8, 9, 10], list(range(40, 75)), [(7 * i) % 300 + 5 for i in range(23)], [101] * 30]
TEXTS = ["The quick brown fox", "Hello, world! How are"]
ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def gloo_env():
    # spawned ranks inherit the environment at start
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENV.items():
            mp.setenv(key, value)
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirank")
    return {"llama": make_tiny_model("llama", root), "moe": make_tiny_model("qwen3_moe", root)}


def single_rank(model: str) -> dict:
    with Engine(model=model, device="cpu") as e:
        return {
            "ids": e.generate(input_ids=PROMPTS, sampling_params=GREEDY),
            "texts": e.generate(TEXTS, GREEDY),
        }


def rank_children() -> list[psutil.Process]:
    """This process's children, but multiprocessing's resource tracker (one per interpreter, not a rank)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_gone(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return
        time.sleep(0.2)
    pytest.fail(f"rank processes still running: {alive}")


@pytest.fixture(scope="module")
def llama_tp2(models):
    before = {p.pid for p in rank_children()}
    engine = Engine(model=models["llama"], device="cpu", tp_size=2)
    pids = list(engine.core.pids.values())
    assert len(pids) == 2 and not before & set(pids)
    try:
        yield engine
    finally:
        engine.shutdown()
        assert_gone(pids)


def test_tp2_greedy_equals_single_rank(models, llama_tp2):
    want = single_rank(models["llama"])
    got = llama_tp2.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert got == [{**w, "meta_info": {**w["meta_info"], "id": g["meta_info"]["id"]}} for w, g in
                   zip(want["ids"], got, strict=True)]  # fmt: skip
    texts = llama_tp2.generate(TEXTS, GREEDY)
    assert [t["text"] for t in texts] == [t["text"] for t in want["texts"]]
    assert [t["output_ids"] for t in texts] == [t["output_ids"] for t in want["texts"]]
    one = llama_tp2.generate(TEXTS[0], GREEDY)
    assert isinstance(one, dict) and one["output_ids"] == want["texts"][0]["output_ids"]
    assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 10}


def test_tp2_streaming_adds_up_to_the_full_result(llama_tp2):
    full = llama_tp2.generate(TEXTS, GREEDY)
    text, ids, finished = collect_stream(llama_tp2, TEXTS, GREEDY)
    assert ids == [f["output_ids"] for f in full] and text == [f["text"] for f in full]
    assert finished == [{"type": "length", "length": 10}] * 2


def test_tp2_stop_strings_early_close_and_errors(llama_tp2):
    base = llama_tp2.generate(TEXTS[0], GREEDY)
    text = base["text"]
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip())
    out = llama_tp2.generate(TEXTS[0], {**GREEDY, "stop": [stop]})
    assert out["text"] == text[: text.index(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    stream = llama_tp2.generate("Hello", {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
    next(stream)
    stream.close()
    assert not llama_tp2.core.has_unfinished()
    with pytest.raises(ValueError, match="temperature"):
        llama_tp2.generate("hi", {"temperature": -1})
    with pytest.raises(ValueError, match=r"600 tokens; this server accepts at most 511 "):
        llama_tp2.generate(input_ids=list(range(5, 605)), sampling_params=GREEDY)
    stats = llama_tp2.get_stats()
    assert stats.num_running == 0 and stats.kv_pages_total > 0
    assert llama_tp2.flush_cache()
    assert (
        llama_tp2.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["meta_info"]["completion_tokens"]
        == 10
    )


def test_ep2_tp2_moe_greedy_equals_single_rank(models):
    want = single_rank(models["moe"])
    with Engine(model=models["moe"], device="cpu", tp_size=2, ep_size=2) as engine:
        pids = list(engine.core.pids.values())
        got = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want["ids"]]
        chunks = list(engine.generate(TEXTS, GREEDY, stream=True))
        assert [sum((c["output_ids"] for c in chunks if c["index"] == i), []) for i in range(2)] == [
            w["output_ids"] for w in want["texts"]
        ]
    assert_gone(pids)


def test_a_dead_rank_raises_instead_of_hanging(models):
    engine = Engine(model=models["llama"], device="cpu", tp_size=2)
    pids = engine.core.pids
    os.kill(pids["scheduler dp0 tp1"], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RanksDied, match=r"a scheduler rank of this Engine died: scheduler dp0 tp[01] \(pid"):
        engine.generate(input_ids=PROMPTS, sampling_params={**GREEDY, "max_new_tokens": 400})
    assert time.monotonic() - started < 60
    assert_gone(list(pids.values()))
    with pytest.raises(RanksDied):
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
    engine.shutdown()


def test_garbage_collection_stops_the_ranks(models):
    engine = Engine(model=models["llama"], device="cpu", tp_size=2)
    pids = list(engine.core.pids.values())
    assert (
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 10
    )
    del engine
    gc.collect()
    assert_gone(pids)


def test_interpreter_exit_without_shutdown_stops_the_ranks(models, tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from tokenspeed import Engine

            if __name__ == "__main__":
                engine = Engine(model={models["llama"]!r}, device="cpu", tp_size=2)
                print("PIDS", *engine.core.pids.values(), flush=True)
                print(engine.generate(input_ids=[5, 6, 7], sampling_params={GREEDY!r})["output_ids"], flush=True)
            """
        )
    )
    env = {**os.environ, **ENV, "PYTHONPATH": ROOT}
    try:
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the interpreter did not exit: {exc.stderr}")
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("PIDS"))
    assert_gone([int(p) for p in line.split()[1:]])


@pytest.mark.parametrize("kwargs", [{"data_parallel_size": 2}, {"dp_size": 2, "tp_size": 2}])
def test_data_parallel_is_refused_by_name(models, kwargs):
    before = {p.pid for p in rank_children()}
    with pytest.raises(ValueError, match=r"data_parallel_size=2 \(--data-parallel-size\).*tokenspeed serve"):
        Engine(model=models["llama"], device="cpu", **kwargs)
    assert {p.pid for p in rank_children()} <= before


def test_conflicting_size_spellings_are_refused(models):
    with pytest.raises(ValueError, match="tp_size=2 and attn_tp_size=1"):
        Engine(model=models["llama"], device="cpu", tp_size=2, attn_tp_size=1)
