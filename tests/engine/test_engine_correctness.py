"""Greedy output of the Engine equals transformers generate(), token for token.

Eight prompts of different lengths (some sharing a prefix) run as one batch on tiny random float32 models,
under every scheduling regime: prefix caching on and off, small chunks (not page aligned) with and without
mixed batches, chunking disabled, and a KV pool so small that requests are preempted and recomputed. Each
configuration generates twice, so the second pass also runs over prefixes cached by the first. After
every run, every KV page is free again.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import ARCHS, EOS_ID, IM_END_ID, load_hf_model, make_tiny_model
from tokenspeed import Engine

MAX_NEW = 12
LENGTHS = [1, 3, 7, 12, 17, 25, 33, 46]


def make_prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    shared = [rng.randrange(5, vocab) for _ in range(16)]
    prompts = []
    for i, n in enumerate(LENGTHS):
        own = [rng.randrange(5, vocab) for _ in range(n)]
        # The four longest prompts start with the same 16 tokens.
        prompts.append((shared + own)[:n] if i >= 4 else own)
    return prompts


def greedy_references(tmp_path_factory, max_new: int, device: str = "cpu"):
    """Per arch, built on first use: the model folder, the prompts and transformers' greedy continuations
    of `max_new` tokens, generated on `device`."""
    cache: dict[str, tuple[str, list[list[int]], list[list[int]]]] = {}

    def get(arch: str):
        if arch not in cache:
            path = make_tiny_model(arch, tmp_path_factory.mktemp(arch))
            hf = load_hf_model(path).to(device)
            prompts = make_prompts(hf.config.vocab_size)
            expected = []
            with torch.no_grad():
                for p in prompts:
                    out = hf.generate(
                        torch.tensor([p], device=device), max_new_tokens=max_new, do_sample=False
                    )
                    expected.append(out[0, len(p) :].tolist())
            del hf
            cache[arch] = (path, prompts, expected)
        return cache[arch]

    return get


CONFIGS = {
    "default": dict(block_size=4),
    "no_prefix_cache": dict(block_size=4, enable_prefix_caching=False),
    "chunked": dict(block_size=4, chunked_prefill_size=7, max_prefill_tokens=7),
    "chunked_mixed": dict(
        block_size=4, chunked_prefill_size=7, max_prefill_tokens=7, enable_mixed_batch=True
    ),
    "no_chunking": dict(block_size=8, chunked_prefill_size=-1, max_prefill_tokens=32),
    "preemption": dict(block_size=4, max_total_tokens=64, enable_mixed_batch=True, chunked_prefill_size=16),
}
CASES = [(arch, c) for arch in ARCHS for c in CONFIGS]
# Tiny models run fastest on one thread; more only spin against each other on a busy 2-core box.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return greedy_references(tmp_path_factory, MAX_NEW)


@pytest.mark.parametrize("arch,config", CASES, ids=[f"{a}-{c}" for a, c in CASES])
def test_greedy_matches_transformers(references, arch, config):
    path, prompts, expected = references(arch)
    kwargs = {"max_total_tokens": 2048, **CONFIGS[config]}
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    with Engine(model=path, device="cpu", dtype="float32", **kwargs) as engine:
        for run in range(2):
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            for i, (out, ref) in enumerate(zip(outs, expected, strict=True)):
                assert out["output_ids"] == ref, (
                    f"{arch}/{config} run {run} prompt {i} (len {len(prompts[i])})"
                )
                assert out["meta_info"]["completion_tokens"] == len(ref)
                reason = out["meta_info"]["finish_reason"]["type"]
                assert reason == ("stop" if ref[-1] in (EOS_ID, IM_END_ID) else "length")
            assert_no_kv_leak(engine, flush=False)
        stats = engine.get_stats()
        if config == "preemption":
            assert stats.num_preemptions > 0, "the tiny pool was meant to force preemption"
        if config == "no_prefix_cache":
            assert stats.prefix_cache_hits == 0
        elif config != "preemption":
            assert stats.prefix_cache_hits > 0, "the second pass should hit the prefixes of the first"
        assert_no_kv_leak(engine)
