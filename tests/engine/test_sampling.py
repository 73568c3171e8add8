"""Sampling: the torch and greedy backends on hand-made logits, then through the Engine on a tiny model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine, SamplingParams
from tokenspeed.runtime.layers.sampling import create_sampler
from tokenspeed.runtime.layers.sampling.torch_sampler import filter_sorted_probs

V = 16


@dataclass
class Row:
    """A request as a sampler sees it."""

    sampling: SamplingParams
    token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    prompt_len: int = 3
    generator: torch.Generator | None = None
    eos_token_ids: frozenset[int] = frozenset({0})

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_len

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len


def row(**kw) -> Row:
    seed = kw.get("seed")
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return Row(SamplingParams(**kw), generator=gen)


@pytest.fixture(scope="module")
def sampler():
    return create_sampler("torch", "cpu")


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(probs)).unsqueeze(0)


def draws(sampler, logits: torch.Tensor, n: int = 300, **kw) -> set[int]:
    rows = [row(**kw) for _ in range(n)]
    return set(sampler(logits.expand(n, -1).contiguous(), rows).token_ids)


def test_filters_in_sorted_order():
    sorted_logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))

    def keep(k, p, m):
        probs = filter_sorted_probs(sorted_logits, torch.tensor([k]), torch.tensor([p]), torch.tensor([m]))
        return (probs[0] > 0).tolist()

    assert keep(2, 1.0, 0.0) == [True, True, False, False, False]
    assert keep(-1, 0.6, 0.0) == [True, True, False, False, False]  # 0.5 < 0.6, 0.7 >= 0.6
    assert keep(-1, 0.45, 0.0) == [True, False, False, False, False]
    assert keep(-1, 1.0, 0.3) == [True, True, True, False, False]  # >= 0.3 * 0.5
    # top-p sees the distribution renormalized after top-k: 0.5/0.7 >= 0.7 keeps one token
    assert keep(2, 0.7, 0.0) == [True, False, False, False, False]


def test_top_k_one_is_greedy(sampler):
    torch.manual_seed(0)
    logits = torch.randn(32, V)
    out = sampler(logits, [row(temperature=1.5, top_k=1) for _ in range(32)])
    assert out.token_ids == logits.argmax(-1).tolist()
    greedy = sampler(logits, [row(temperature=0.0) for _ in range(32)])
    assert greedy.token_ids == out.token_ids


def test_top_p_and_min_p_mask_the_tail(sampler):
    logits = logits_of([0.4, 0.3, 0.2, 0.06, 0.04] + [0.0] * (V - 5))
    assert draws(sampler, logits, top_p=0.65) == {0, 1}
    assert draws(sampler, logits, min_p=0.4) == {0, 1, 2}  # p >= 0.16
    assert draws(sampler, logits) == {0, 1, 2, 3, 4}  # nothing masked: every token shows up


def test_seeded_rows_do_not_depend_on_the_batch(sampler):
    torch.manual_seed(1)
    logits = torch.randn(4, V)
    alone = [sampler(logits[i : i + 1], [row(seed=42 + i)]).token_ids[0] for i in range(4)]
    together = sampler(logits, [row(seed=42 + i) for i in range(4)]).token_ids
    assert alone == together
    many = {sampler(logits[:1], [row(seed=s)]).token_ids[0] for s in range(40)}
    assert len(many) > 1  # the seed matters


def test_penalties(sampler):
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 6] = 3.0, 2.0
    seen = Row(SamplingParams(temperature=0.0, repetition_penalty=2.0), token_ids=[5, 9, 9], prompt_len=1)
    assert sampler(logits, [seen]).token_ids == [6]  # 3 / 2 < 2
    # Frequency counts output tokens only: token 5 is in the prompt here, so it stays.
    freq = Row(SamplingParams(temperature=0.0, frequency_penalty=2.0), token_ids=[5, 6, 6], prompt_len=1)
    assert sampler(logits, [freq]).token_ids == [5]
    pres = Row(SamplingParams(temperature=0.0, presence_penalty=1.5), token_ids=[1, 5], prompt_len=1)
    assert sampler(logits, [pres]).token_ids == [6]
    assert sampler(logits, [Row(SamplingParams(temperature=0.0))]).token_ids == [5]


def test_min_new_tokens_masks_eos_and_stop_tokens(sampler):
    logits = torch.zeros(1, V)
    logits[0, 0], logits[0, 7], logits[0, 3] = 9.0, 8.0, 1.0
    early = Row(SamplingParams(temperature=0.0, min_new_tokens=2, stop_token_ids=[7]), prompt_len=3)
    assert sampler(logits, [early]).token_ids == [3]
    done = Row(SamplingParams(temperature=0.0, min_new_tokens=2), token_ids=[1, 2, 3, 4, 5], prompt_len=3)
    assert sampler(logits, [done]).token_ids == [0]


def test_logprobs_and_nan_detection():
    s = create_sampler("torch", "cpu", enable_nan_detection=True)
    logits = torch.randn(2, V)
    logits[1, 3] = float("nan")
    out = s(logits, [row(temperature=0.0, logprobs=True), row(temperature=0.0)])
    assert out.nan_rows == [False, True]
    expected = torch.log_softmax(logits[0], -1)[out.token_ids[0]].item()
    assert math.isclose(out.logprobs[0], expected, rel_tol=1e-5)


def test_greedy_backend_ignores_temperature():
    s = create_sampler("greedy", "cpu")
    logits = torch.randn(8, V)
    assert s(logits, [row(temperature=2.0) for _ in range(8)]).token_ids == logits.argmax(-1).tolist()


def test_unknown_backend_names_the_available_ones():
    with pytest.raises(ValueError, match=r"--sampling-backend 'magic'.*'greedy'.*'torch'"):
        create_sampler("magic", "cpu")


# ---- through the Engine -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    path = make_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    with Engine(model=path, device="cpu", block_size=4, max_total_tokens=4096, sampling_backend="torch") as e:
        yield e
    torch.set_num_threads(before)


PROMPT = [[17, 33, 90, 120, 7, 64]]
OTHER = [[44, 45, 46, 200, 201, 300, 12, 13, 14]]


def gen(engine, prompts, **sp):
    return [
        o["output_ids"]
        for o in engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, **sp})
    ]


def test_engine_seeded_sampling_is_reproducible_across_batches(engine):
    sp = dict(temperature=1.5, seed=1234, ignore_eos=True)
    alone = gen(engine, PROMPT, **sp)[0]
    batched = gen(engine, OTHER + PROMPT + OTHER, **sp)[1]
    assert alone == batched
    others = {tuple(gen(engine, PROMPT, temperature=1.5, seed=s, ignore_eos=True)[0]) for s in range(5)}
    assert len(others) > 1
    assert_no_kv_leak(engine, flush=False)


def test_engine_top_k_one_equals_greedy(engine):
    greedy = gen(engine, PROMPT + OTHER, temperature=0.0)
    assert gen(engine, PROMPT + OTHER, temperature=1.0, top_k=1) == greedy


def test_engine_penalties_change_the_output(engine):
    prompt = [[231, 271, 138, 36, 285, 12, 52, 373]]
    base = dict(temperature=0.0, ignore_eos=True, max_new_tokens=32)
    greedy = gen(engine, prompt, **base)[0]
    repeats = len(greedy) - len(set(greedy))
    assert repeats > 0, "the greedy continuation should repeat itself for penalties to matter"
    for penalty in (dict(repetition_penalty=3.0), dict(frequency_penalty=2.0), dict(presence_penalty=2.0)):
        out = gen(engine, prompt, **base, **penalty)[0]
        assert out != greedy, penalty
        assert len(out) - len(set(out)) < repeats, penalty
    assert_no_kv_leak(engine)


def test_engine_nan_detection_aborts_with_an_error(tmp_path_factory):
    path = make_tiny_model("llama", tmp_path_factory.mktemp("nan"))
    with Engine(model=path, device="cpu", block_size=4, max_total_tokens=512, enable_nan_detection=True) as e:
        with torch.no_grad():
            e.core.runner.model.lm_head.weight[5].fill_(float("nan"))
        out = e.generate(input_ids=PROMPT[0], sampling_params={"max_new_tokens": 4})
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert "NaN" in out["meta_info"]["finish_reason"]["message"]
        assert out["output_ids"] == []
        assert e.get_stats().num_nan_aborted == 1
        assert_no_kv_leak(e)


@pytest.mark.parametrize("name", ["torch", "greedy"])
def test_warm_up_samples_a_typical_request_on_every_cpu_backend(name):
    # On the GPU the same call loads (or compiles) the backend's kernels at start-up; here it must at least
    # run the real sampling path with the stand-in requests and leave the sampler usable.
    sampler = create_sampler(name, "cpu")
    assert sampler.warm_up(vocab_size=97) >= 0.0
    logits = torch.full((1, 97), -10.0)
    logits[0, 42] = 10.0
    assert sampler(logits, [Row(SamplingParams(temperature=0.0))]).token_ids == [42]
