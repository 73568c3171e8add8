"""Prompt logprobs on a real server (the demo model) through the official `openai` client and /generate:
completions `echo` with `logprobs`, vLLM's `prompt_logprobs` on completions and chat, and /generate's
`logprob_start_len`, checked against a float64 log_softmax of transformers' logits on the same model.

Prefill chunks of 8 tokens: the long prompt is computed over several chunks, the short one in one; the
prefix cache is on, and the long prompt is served once without prompt logprobs first, so its pages are cached.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.server.server_proc import module_server
from tokenspeed.demo_models import DEMO_MODELS

MODEL = str(DEMO_MODELS[0].path)
LONG = "To open a file, you can use the open function, which returns a file object that you can read from."
SHORT = "When an exception"
# Two requests for the same tokens need not run the same float32 arithmetic: with echo the whole prompt is
# computed again (prompt logprobs bypass the prefix cache), without it the cached pages are reused and only
# the rest is computed, in other chunk and batch shapes, so the sums in each matmul and softmax run in another
# order. float32 keeps ~7 significant digits and a logprob is the difference of two O(10) numbers (logit and
# log-sum-exp), so the same value can differ by a few 1e-6 absolute; pytest.approx's default 1e-6 relative
# asks for less than one float32 step. 1e-4 is well above that rounding and far below any real difference
# (the check against float64 transformers allows 2e-3).
SAME_TOKENS_ABS = 1e-4


srv = module_server(
    MODEL, "prompt-logprobs-logs",
    "--served-model-name", "demo",
    "--enable-output-logprobs",
    "--enable-cache-report",
    "--chunked-prefill-size", "8",
)  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    """prompt -> (token ids, [len, vocab] float64 next-token log-probabilities at each position)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float64)
    out = {}
    for text in (LONG, SHORT):
        ids = tok.encode(text)
        with torch.no_grad():
            out[text] = (ids, torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1))
    return out


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(client, reference):
    ids, ref = reference[LONG]
    assert len(ids) > 16  # several prefill chunks
    client.completions.create(model="demo", prompt=LONG, max_tokens=1)  # its prefix is now cached
    for text in (LONG, SHORT):
        ids, ref = reference[text]
        r = client.completions.create(
            model="demo", prompt=text, max_tokens=3, temperature=0, echo=True, logprobs=2
        )
        choice, lp = r.choices[0], r.choices[0].logprobs
        assert choice.text.startswith(text) and len(lp.tokens) == len(ids) + 3
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert r.usage.prompt_tokens == len(ids) and r.usage.prompt_tokens_details.cached_tokens == 0
        for k in range(1, len(ids)):
            assert lp.token_logprobs[k] == pytest.approx(ref[k - 1, ids[k]].item(), abs=2e-3), (text, k)
            best = sorted(lp.top_logprobs[k].values(), reverse=True)
            assert best[0] == pytest.approx(ref[k - 1].max().item(), abs=2e-3), (text, k)
        assert lp.text_offset[: len(ids)] == sorted(lp.text_offset[: len(ids)])
        # the completion's own logprobs follow, as without echo
        plain = client.completions.create(model="demo", prompt=text, max_tokens=3, temperature=0, logprobs=2)
        assert lp.token_logprobs[len(ids) :] == pytest.approx(
            plain.choices[0].logprobs.token_logprobs, abs=SAME_TOKENS_ABS
        )
        assert choice.text == text + plain.choices[0].text
    # max_tokens 0: the prompt alone is scored (what evaluation harnesses send)
    ids, ref = reference[SHORT]
    r = client.completions.create(model="demo", prompt=SHORT, max_tokens=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == SHORT and r.usage.completion_tokens == 0 and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[1:] == pytest.approx(
        [ref[k - 1, ids[k]].item() for k in range(1, len(ids))], abs=2e-3
    )


def test_streamed_echo_logprobs_add_up_to_the_whole_answer(client):
    whole = client.completions.create(
        model="demo", prompt=LONG, max_tokens=4, temperature=0, echo=True, logprobs=1
    )
    tokens, lps, offsets, text = [], [], [], ""
    stream = client.completions.create(
        model="demo", prompt=LONG, max_tokens=4, temperature=0, echo=True, logprobs=1, stream=True
    )
    for chunk in stream:
        c = chunk.choices[0]
        text += c.text
        if c.logprobs is not None:
            tokens += c.logprobs.tokens
            lps += c.logprobs.token_logprobs
            offsets += c.logprobs.text_offset
    want = whole.choices[0].logprobs
    assert text == whole.choices[0].text
    assert tokens == want.tokens and offsets == want.text_offset
    assert lps[0] is None and lps[1:] == pytest.approx(want.token_logprobs[1:], abs=SAME_TOKENS_ABS)


def _check_vllm_entries(entries: list, ids: list[int], ref: torch.Tensor, top: int) -> None:
    """vLLM's shape: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}} holding
    the prompt's own token and the `top` most likely (rank 1..top)."""
    assert len(entries) == len(ids) and entries[0] is None
    for k in range(1, len(ids)):
        row, entry = ref[k - 1], {int(t): v for t, v in entries[k].items()}
        own = entry[ids[k]]
        assert own["logprob"] == pytest.approx(row[ids[k]].item(), abs=2e-3)
        # its rank: 1 + the tokens likelier than it (float32 against float64: a near tie may go either way)
        likelier = [int((row > row[ids[k]] + d).sum()) for d in (1e-3, -1e-3)]
        assert likelier[0] + 1 <= own["rank"] <= likelier[1] + 1
        by_rank = {v["rank"]: t for t, v in entry.items()}
        assert [by_rank[r] for r in range(1, top + 1)] == row.topk(top).indices.tolist()
        assert len(entry) in (top, top + 1) and all(v["decoded_token"] is not None for v in entry.values())


def test_vllm_prompt_logprobs_on_completions_chat_and_generate(srv, client, reference):
    ids, ref = reference[LONG]
    r = client.completions.create(model="demo", prompt=LONG, max_tokens=2, extra_body={"prompt_logprobs": 3})
    _check_vllm_entries(r.choices[0].model_extra["prompt_logprobs"], ids, ref, 3)
    assert r.choices[0].logprobs is None  # the output's logprobs only when asked for
    # chat: the response's prompt_logprobs cover the templated prompt
    r = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body={"prompt_logprobs": 0},
    )
    entries = r.model_extra["prompt_logprobs"]
    assert len(entries) == r.usage.prompt_tokens and entries[0] is None
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in entries[1:])
    # /generate: SGLang's input logprobs from logprob_start_len on
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 5, "top_logprobs_num": 2}  # fmt: skip
    meta = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()["meta_info"]
    assert [t for _, t, _ in meta["input_token_logprobs"]] == ids[5:]
    for k, (lp, tid, _) in enumerate(meta["input_token_logprobs"], start=5):
        assert lp == pytest.approx(ref[k - 1, tid].item(), abs=2e-3)
        assert [t for _, t, _ in meta["input_top_logprobs"][k - 5]] == ref[k - 1].topk(2).indices.tolist()
    meta = httpx.post(f"{srv.url}/generate", json={**body, "logprob_start_len": -1}, timeout=60).json()[
        "meta_info"
    ]
    assert "input_token_logprobs" not in meta and len(meta["output_token_logprobs"]) == 1


def test_prompt_logprobs_requests_that_cannot_be_answered_are_400(srv, client):
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs: not available with stream"):
        client.completions.create(
            model="demo", prompt="Hi", max_tokens=1, stream=True, extra_body={"prompt_logprobs": 1}
        )
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs must be between 0 and 20"):
        client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Hi"}], extra_body={"prompt_logprobs": 21}
        )
    body = {"text": "Hi", "return_logprob": True, "logprob_start_len": -2}
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=60)
    assert r.status_code == 400 and "logprob_start_len" in r.json()["error"]["message"]


def test_output_logprobs_include_the_repetition_penalty(srv):
    """Output logprobs are of the distribution the token is drawn from: penalties in (prompt logprobs are the
    model's own)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(MODEL).encode(LONG)
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float64)
    with torch.no_grad():
        rows = model(torch.tensor([ids])).logits[0].double()
    logits = rows[-1]
    seen = torch.zeros_like(logits, dtype=torch.bool)
    seen[ids] = True
    penalized = torch.where(seen, torch.where(logits > 0, logits / 1.5, logits * 1.5), logits)
    want_lp, want_ids = torch.log_softmax(penalized, dim=-1).topk(5)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0, "repetition_penalty": 1.5},
            "return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": len(ids) - 1}  # fmt: skip
    meta = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()["meta_info"]
    top = meta["output_top_logprobs"][0]
    assert [t for _, t, _ in top] == want_ids.tolist()
    assert [lp for lp, _, _ in top] == pytest.approx(want_lp.tolist(), abs=2e-3)
    # the prompt's last token is scored by the raw model, penalty or not
    raw = torch.log_softmax(rows[-2], dim=-1)
    assert meta["input_token_logprobs"][0][0] == pytest.approx(raw[ids[-1]].item(), abs=2e-3)
