"""Prompt logprobs (SGLang's input_token_logprobs through the offline Engine) against a float64 log_softmax of
transformers' logits on the same tiny model: whole prompts, prompts split over many prefill chunks, prompts
whose prefix is in the prefix cache, a logprob_start_len, and max_new_tokens 0 (scoring only)."""

from __future__ import annotations

import pytest
import torch

from tests.leak_check import assert_no_kv_leak
from tests.tiny_models import make_tiny_model
from tokenspeed import Engine

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = list(range(20, 61))  # 41 tokens: 6 chunks of 8, and 10 pages of 4 for the prefix cache
TOP = 3


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def reference(model_path) -> torch.Tensor:
    """[len(PROMPT), vocab] float64 log-probabilities of the next token at each prompt position."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float64)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)


def _check(meta: dict, ref: torch.Tensor, start: int) -> None:
    tokens, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert [t for _, t, _ in tokens] == PROMPT[start:]
    assert len(tops) == len(PROMPT) - start
    if start == 0:
        assert tokens[0][0] is None and tops[0] is None  # nothing predicts the first token
    for k in range(max(start, 1), len(PROMPT)):
        lp, tid, _ = tokens[k - start]
        row = ref[k - 1]
        assert lp == pytest.approx(row[tid].item(), abs=2e-4), k
        want_lp, want_ids = row.topk(TOP)
        got = tops[k - start]
        assert [g[0] for g in got] == pytest.approx(want_lp.tolist(), abs=2e-4), k
        assert [g[1] for g in got] == want_ids.tolist(), k


def _params(**extra) -> dict:
    return {"max_new_tokens": 2, "temperature": 0.0, "prompt_logprobs": TOP, **extra}


@pytest.mark.parametrize("chunk", [None, 8], ids=["whole", "chunked"])
def test_prompt_logprobs_match_transformers(model_path, reference, chunk):
    with Engine(model=model_path, block_size=4, max_total_tokens=1024, chunked_prefill_size=chunk or -1) as e:
        plain = e.generate(input_ids=PROMPT, sampling_params={"max_new_tokens": 2, "temperature": 0.0})
        assert "input_token_logprobs" not in plain["meta_info"]  # nothing computed unless asked
        # the prompt's pages are now cached: the request with prompt logprobs must compute them anyway
        scored = e.generate(input_ids=PROMPT, sampling_params=_params())
        _check(scored["meta_info"], reference, 0)
        assert scored["output_ids"] == plain["output_ids"]
        # from token 24 on: the pages before it may come from the cache, the rest is computed
        late = e.generate(input_ids=PROMPT, sampling_params=_params(logprob_start_len=24))
        _check(late["meta_info"], reference, 24)
        assert late["meta_info"]["cached_tokens"] > 0
        # scoring only: no output token, every prompt logprob
        only = e.generate(input_ids=PROMPT, sampling_params=_params(max_new_tokens=0))
        assert only["output_ids"] == [] and only["meta_info"]["finish_reason"]["type"] == "length"
        _check(only["meta_info"], reference, 0)
        # a batch: one scored request next to plain ones, in the same steps
        batch = e.generate(
            input_ids=[PROMPT[:9], PROMPT, PROMPT[:30]],
            sampling_params=[{"max_new_tokens": 3}, _params(), {"max_new_tokens": 3}],
        )
        _check(batch[1]["meta_info"], reference, 0)
        assert "input_token_logprobs" not in batch[0]["meta_info"]
        assert_no_kv_leak(e)
