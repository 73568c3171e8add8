"""The OpenAI-compatible API of a real server, driven by the official `openai` client."""

from __future__ import annotations

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.server.conftest import SERVED_NAME

MESSAGES = [{"role": "user", "content": "Hello, how are you today?"}]
# Long enough to fill whole KV pages (the prefix cache works at page granularity).
LONG_MESSAGES = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 8}]
# A random model may sample EOS at any point; tests that count tokens ignore it.
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client(timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def test_models_lists_the_served_name(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [SERVED_NAME]


def test_chat_completion(client, tokenizer):
    resp = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=8, temperature=0,
                                          extra_body=NO_EOS)  # fmt: skip
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt_ids, list):  # newer transformers return a BatchEncoding
        prompt_ids = prompt_ids["input_ids"]
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.usage.completion_tokens == 8
    assert resp.usage.total_tokens == len(prompt_ids) + 8
    assert resp.usage.prompt_tokens_details.cached_tokens == 0


def test_cache_report_counts_prefix_hits(client):
    first = client.chat.completions.create(
        model=SERVED_NAME, messages=LONG_MESSAGES, max_tokens=4, temperature=0
    )
    again = client.chat.completions.create(
        model=SERVED_NAME, messages=LONG_MESSAGES, max_tokens=4, temperature=0
    )
    assert again.choices[0].message.content == first.choices[0].message.content
    # --enable-cache-report: the second time the prompt's full pages come from the prefix cache.
    assert 0 < again.usage.prompt_tokens_details.cached_tokens <= again.usage.prompt_tokens


def test_chat_stream_matches_non_stream(client):
    ref = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=12, temperature=0, extra_body=NO_EOS
    )
    stream = client.chat.completions.create(
        model=SERVED_NAME,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_EOS,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_stream_with_n_sequences(client):
    stream = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=6, temperature=1.0, seed=3, n=2, stream=True,
        extra_body=NO_EOS,
    )  # fmt: skip
    texts: dict[int, str] = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1}
    assert texts[0] and texts[1]


def test_completions_stream_and_not(client):
    ref = client.completions.create(
        model=SERVED_NAME, prompt="The quick brown fox", max_tokens=10, temperature=0, extra_body=NO_EOS
    )
    assert ref.choices[0].finish_reason == "length"
    assert ref.usage.completion_tokens == 10
    stream = client.completions.create(
        model=SERVED_NAME,
        prompt="The quick brown fox",
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body=NO_EOS,
    )
    text = "".join(c.choices[0].text for c in stream)
    assert text == ref.choices[0].text


def test_completions_n_and_batch(client):
    # Two prompts, three seeded samples each.
    request = {
        "model": SERVED_NAME,
        "prompt": ["Hello", "Once upon a time"],
        "n": 3,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 7,
        "extra_body": NO_EOS,
    }
    resp = client.completions.create(**request)
    assert sorted(c.index for c in resp.choices) == list(range(6))
    assert resp.usage.completion_tokens == 36
    # Different seeds per sequence: sampled continuations of one prompt are not all equal.
    first_prompt = [c.text for c in resp.choices if c.index < 3]
    assert len(set(first_prompt)) > 1
    # The same seeded request gives the same samples again.
    again = client.completions.create(**request)
    assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == [
        c.text for c in sorted(resp.choices, key=lambda c: c.index)
    ]


def test_stop_string_cuts_the_text(client):
    ref = client.completions.create(
        model=SERVED_NAME, prompt="The capital of France", max_tokens=24, temperature=0, extra_body=NO_EOS
    )
    text = ref.choices[0].text
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip())
    cut = client.completions.create(
        model=SERVED_NAME,
        prompt="The capital of France",
        max_tokens=24,
        temperature=0,
        stop=[stop],
        extra_body=NO_EOS,
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_chat_logprobs(client):
    resp = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, extra_body=NO_EOS
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == 5
    assert all(t.logprob <= 0.0 for t in content)
    # Greedy picks the most likely token: its probability is not tiny for this random model.
    assert max(t.logprob for t in content) > -20


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    assert err.value.body["code"] == "model_not_found"


def test_bad_sampling_value_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=2, temperature=-1)
    assert "temperature" in err.value.body["message"]


def test_prompt_longer_than_context_is_400(client, server):
    info = server.server_info()
    too_long = [5] * (info["max_req_input_len"] + 1)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED_NAME, prompt=too_long, max_tokens=2)
    assert err.value.body["code"] == "context_length_exceeded"


def test_wrong_api_key_is_401(server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx.post(f"{server.url}/generate", json={"text": "hi"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    # /health stays open for load balancers and supervisors.
    assert httpx.get(f"{server.url}/health").status_code == 200
