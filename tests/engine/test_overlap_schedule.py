"""Overlap scheduling gives exactly the outputs of the synchronous step (`--disable-overlap-schedule`).

Every test runs the same requests on two engines over the same tiny random model, one with overlap
scheduling (the default on a GPU, asked for explicitly here on the CPU) and one without, and compares what a user sees: greedy tokens (also against
transformers), seeded samples, stop tokens hit mid-batch (the token sampled one step ahead is never shown
nor counted), streamed chunks, aborts while a batch is in flight, preemption, chunked prefill and penalties
(which fall back to the synchronous order). After every run no KV page is held.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import load_hf_model, make_tiny_model
from tokenspeed import Engine
from tokenspeed.runtime.engine.io_struct import GenerateRequest

MAX_NEW = 10
LENGTHS = [1, 4, 9, 16, 23, 31]
CONFIGS = {
    "default": dict(block_size=4, max_total_tokens=2048),
    "chunked_mixed": dict(
        block_size=4,
        max_total_tokens=2048,
        chunked_prefill_size=7,
        max_prefill_tokens=7,
        enable_mixed_batch=True,
    ),
    # 64 tokens of KV for six requests of up to 41 tokens: requests are preempted and recomputed.
    "preemption": dict(block_size=4, max_total_tokens=64, enable_mixed_batch=True, chunked_prefill_size=16),
}
ARCHS = ("llama", "qwen3_moe")
# Tiny models run fastest on one thread; more only spin against each other on a busy 2-core box.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (model folder, prompts of mixed lengths), built lazily."""
    cache: dict[str, tuple[str, list[list[int]]]] = {}

    def get(arch: str) -> tuple[str, list[list[int]]]:
        if arch not in cache:
            path = make_tiny_model(arch, tmp_path_factory.mktemp(arch))
            rng = random.Random(11)
            prompts = [[rng.randrange(5, 200) for _ in range(n)] for n in LENGTHS]
            cache[arch] = (path, prompts)
        return cache[arch]

    return get


@contextmanager
def two_engines(path: str, **kwargs) -> Iterator[tuple[Engine, Engine]]:
    """(overlap, synchronous) engines of the same model and settings; both must end with no KV held."""
    with Engine(
        model=path, device="cpu", dtype="float32", disable_overlap_schedule=False, **kwargs
    ) as overlap:
        with Engine(
            model=path, device="cpu", dtype="float32", disable_overlap_schedule=True, **kwargs
        ) as sync:
            assert overlap.core.overlap and not sync.core.overlap
            yield overlap, sync
            for engine in (overlap, sync):
                assert_no_kv_leak(engine)


def generated(engine: Engine) -> int:
    """Generated tokens the engine counted for gen_throughput (since start; stats() is not called)."""
    return sum(n for _, n in engine.core._gen_events)


def hf_greedy(path: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    hf = load_hf_model(path)
    with torch.no_grad():
        return [
            hf.generate(torch.tensor([p]), max_new_tokens=max_new, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_equals_sync_and_transformers(models, arch, config):
    path, prompts = models(arch)
    expected = hf_greedy(path, prompts, MAX_NEW)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    with two_engines(path, **CONFIGS[config]) as (overlap, sync):
        for run in range(2):  # the second run also goes over prefixes cached by the first
            got = overlap.generate(input_ids=prompts, sampling_params=params)
            ref = sync.generate(input_ids=prompts, sampling_params=params)
            for i, (a, b, hf) in enumerate(zip(got, ref, expected, strict=True)):
                where = f"{arch}/{config} run {run} prompt {i} (len {len(prompts[i])})"
                assert a["output_ids"] == b["output_ids"] == hf, where
                assert a["meta_info"] == {**b["meta_info"], "id": a["meta_info"]["id"]}, where
        assert generated(overlap) == generated(sync) == 2 * sum(len(o) for o in expected)
        if config == "preemption":
            assert overlap.get_stats().num_preemptions > 0 and sync.get_stats().num_preemptions > 0


def test_stop_tokens_mid_batch_never_show_the_token_sampled_ahead(models):
    """Each prompt stops at a different step; streamed chunks (every 3 tokens) match the synchronous ones."""
    path, prompts = models("llama")
    free = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    kwargs = dict(CONFIGS["default"], stream_interval=3)
    with two_engines(path, **kwargs) as (overlap, sync):
        full = [o["output_ids"] for o in sync.generate(input_ids=prompts, sampling_params=free)]
        params, expected = [], []
        for i, out in enumerate(full):
            at = min(i * 2, len(out) - 1)  # stops after 1, 3, 5, ... tokens
            stop = out[at]
            params.append({**free, "stop_token_ids": [stop]})
            expected.append(out[: out.index(stop) + 1])
        # min_new_tokens keeps the first one going past its stop token: it ends later, by length.
        params[0]["min_new_tokens"] = 4
        before = generated(overlap), generated(sync)

        def chunks(engine: Engine) -> dict[int, list[list[int]]]:
            got = defaultdict(list)
            for upd in engine.generate(input_ids=prompts, sampling_params=params, stream=True):
                got[upd["index"]].append(upd["output_ids"])
            return got

        got, ref = chunks(overlap), chunks(sync)
        assert got == ref
        outs = {i: [t for c in cs for t in c] for i, cs in got.items()}
        for i in range(1, len(prompts)):
            assert outs[i] == expected[i], f"prompt {i}"
        stop0 = params[0]["stop_token_ids"][0]
        assert len(outs[0]) >= 4 and stop0 not in outs[0][:4], outs[0]
        total = sum(len(o) for o in outs.values())
        assert generated(overlap) - before[0] == generated(sync) - before[1] == total


@pytest.mark.parametrize("max_new", [1, 2])
def test_max_new_tokens_known_ends_without_extra_work(models, max_new):
    """A request whose last token is in flight is not scheduled again: both modes compute the same tokens."""
    path, prompts = models("llama")
    params = {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True}
    with two_engines(path, **CONFIGS["default"]) as (overlap, sync):
        computed = []
        for engine in (overlap, sync):
            engine.get_stats()  # drains the per-iteration token counts
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            assert all(len(o["output_ids"]) == max_new for o in outs)
            computed.append((sum(engine.get_stats().iteration_tokens), [o["output_ids"] for o in outs]))
        assert computed[0] == computed[1]
        assert computed[0][0] == sum(len(p) for p in prompts) + len(prompts) * (max_new - 1)


def _stream_core(core, rid: str, prompt: list[int], max_new: int) -> None:
    sampling = {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True}
    core.add_request(GenerateRequest(rid, prompt, sampling, stream=True))


def _run_core(core, outputs: dict[str, list], limit: int = 500) -> None:
    for _ in range(limit):
        if not core.has_unfinished():
            return
        for o in core.step():
            outputs[o.rid].append(o)
    raise AssertionError("the engine did not finish")


def test_abort_while_a_batch_is_in_flight(models):
    path, prompts = models("llama")
    with two_engines(path, **CONFIGS["default"]) as (overlap, sync):
        alone = sync.generate(
            input_ids=prompts[3],
            sampling_params={"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True},
        )["output_ids"]
        core = overlap.core
        outputs: dict[str, list] = defaultdict(list)
        _stream_core(core, "early", prompts[2], 16)  # aborted while its prefill is in flight
        _stream_core(core, "late", prompts[4], 16)  # aborted after some tokens
        _stream_core(core, "kept", prompts[3], 16)
        for o in core.step():
            outputs[o.rid].append(o)
        assert core.has_unfinished() and not core.flush_cache()  # refused with a batch in flight
        assert core.abort_request("early")
        for _ in range(3):
            for o in core.step():
                outputs[o.rid].append(o)
        assert core.abort_request("late", reason="stop")
        _run_core(core, outputs)
        for rid, reason in (("early", "abort"), ("late", "stop")):
            final = outputs[rid][-1]
            shown = [t for o in outputs[rid] for t in o.new_token_ids]
            assert final.finished and final.finish_reason == reason and final.new_token_ids == []
            assert final.completion_tokens == len(shown), rid  # the token in flight was dropped
        assert outputs["early"][-1].completion_tokens == 0
        assert outputs["late"][-1].completion_tokens >= 2
        assert [t for o in outputs["kept"] for t in o.new_token_ids] == alone
        assert not core.has_unfinished() and core.flush_cache()


def test_seeded_sampling_is_the_same_in_both_modes(models):
    path, prompts = models("llama")
    params = [
        {
            "max_new_tokens": 12,
            "temperature": 0.9,
            "top_k": 20,
            "top_p": 0.95,
            "seed": 100 + i,
            "ignore_eos": True,
        }
        for i in range(len(prompts))
    ]
    params[1] = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}  # greedy in the same batch
    params[2] = {**params[2], "min_p": 0.05, "min_new_tokens": 5}
    for config in ("default", "chunked_mixed"):
        with two_engines(path, **CONFIGS[config]) as (overlap, sync):
            got = overlap.generate(input_ids=prompts, sampling_params=params)
            ref = sync.generate(input_ids=prompts, sampling_params=params)
            assert [o["output_ids"] for o in got] == [o["output_ids"] for o in ref], config
            # The seeds matter: different seeds give different samples.
            other = overlap.generate(input_ids=prompts, sampling_params=[{**p, "seed": 7} for p in params])
            assert [o["output_ids"] for o in other] != [o["output_ids"] for o in got]


def test_penalties_fall_back_to_the_synchronous_order(models):
    """A request whose sampler counts its generated tokens is never scheduled ahead of them."""
    path, prompts = models("qwen3_moe")
    base = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    params = [dict(base) for _ in prompts]
    penalized = {0, 1, 3}
    for i in penalized:  # shorter, so the others also run ahead once these are done
        params[i]["max_new_tokens"] = 16
    unpenalized = [dict(p) for p in params]
    params[0]["repetition_penalty"] = 3.0
    params[1]["frequency_penalty"] = 2.0
    params[3]["presence_penalty"] = 2.0
    with two_engines(path, **CONFIGS["default"]) as (overlap, sync):
        # prompt index -> decodes launched before their input token was on the host
        ahead: dict[int, int] = defaultdict(int)
        runner = overlap.core.runner
        launch = runner.launch
        index_of: dict[str, int] = {}

        def watching_launch(batch, prev=None):
            for it in batch.items:
                if len(it.req.token_ids) < it.start + it.num_new_tokens:
                    ahead[index_of[it.req.rid]] += 1
            return launch(batch, prev)

        runner.launch = watching_launch
        try:
            seqs, _ = overlap._submit(None, prompts, params)
            index_of.update({s.rid: s.index for s in seqs})
            for _ in overlap._run(seqs):
                pass
            got = [s.output_ids for s in seqs]
        finally:
            runner.launch = launch
        ref = [o["output_ids"] for o in sync.generate(input_ids=prompts, sampling_params=params)]
        plain = [o["output_ids"] for o in sync.generate(input_ids=prompts, sampling_params=unpenalized)]
        assert got == ref
        assert all(ref[i] != plain[i] for i in penalized), [(ref[i], plain[i]) for i in penalized]
        assert not any(ahead[i] for i in penalized), dict(ahead)
        assert all(ahead[i] > 0 for i in range(len(prompts)) if i not in penalized), dict(ahead)


def test_flag_and_start_up_log(models, caplog):
    path, prompts = models("llama")
    with caplog.at_level(logging.INFO, logger="tokenspeed.runtime.engine.engine_core"):
        with two_engines(path, **CONFIGS["default"]) as (overlap, sync):
            assert overlap.generate(input_ids=prompts[1], sampling_params={"max_new_tokens": 3})
    lines = [r.getMessage() for r in caplog.records if "overlap scheduling" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("overlap scheduling: on")
    assert lines[1].startswith(
        "overlap scheduling: off (--disable-overlap-schedule, the default with --device cpu"
    )


def test_cpu_default_is_synchronous_and_a_gpu_default_overlaps(models):
    from tokenspeed.config.cli import prepare_server_args
    from tokenspeed.config.resolve import PlatformFacts

    path, prompts = models("llama")
    with Engine(model=path, device="cpu", dtype="float32") as engine:
        assert engine.server_args.disable_overlap_schedule is True and not engine.core.overlap
        assert engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 2})["output_ids"]
    hopper = PlatformFacts("nvidia", is_hopper_or_newer=True, gpu_memory_gb=141.0)
    assert prepare_server_args([path], platform=hopper).disable_overlap_schedule is False
    flagged = prepare_server_args([path, "--disable-overlap-schedule"], platform=hopper)
    assert flagged.disable_overlap_schedule is True


@pytest.mark.parametrize(
    "experts",
    [
        {"enable_expert_distribution_metrics": True},
        {"ep_num_redundant_experts": 4, "enable_eplb": True, "eplb_rebalance_num_iterations": 5},
    ],
    ids=["recording", "eplb"],
)
def test_one_rank_managing_its_experts_schedules_ahead(models, experts):
    """Recording the expert load (and EPLB rebalancing it) on a single-rank server is applied between steps on
    its one device: it must not turn overlap off (at batch 1 on the H200 that cost 55% of the step), and the
    overlapped engine gives the synchronous one's tokens and counts the same expert load."""
    path, prompts = models("qwen3_moe")
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    with two_engines(path, **CONFIGS["default"], **experts) as (overlap, sync):
        for run in range(2):  # EPLB rebalances every 5 passes: both runs cross a rebalance
            got = overlap.generate(input_ids=prompts, sampling_params=params)
            ref = sync.generate(input_ids=prompts, sampling_params=params)
            assert [o["output_ids"] for o in got] == [o["output_ids"] for o in ref], f"run {run}"
        if "enable_eplb" in experts:
            assert overlap.core.experts.eplb.stats.rebalances == sync.core.experts.eplb.stats.rebalances > 0
        else:
            loads = [torch.as_tensor(e.get_stats().expert_load).sum().item() for e in (overlap, sync)]
            assert loads[0] == loads[1] > 0, loads
