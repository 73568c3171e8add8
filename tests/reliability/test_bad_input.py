"""Bad input is a 400 naming the field, never a 5xx, and never leaves a request behind.

Seen before: token id -1 or 2**70 and seed 2**80 answered 500 ("internal error: OverflowError") and the
seed left a request in flight for ever; temperature NaN or Infinity was accepted; a lone surrogate in a
prompt got the tokenizer's internals as its message.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.reliability.conftest import SERVED_NAME, inflight

FLOAT_FIELDS = [
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
]
# Python's JSON reads these (1e400 overflows to inf); no sampler can use them.
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served.url, headers=served.headers, timeout=30) as c:
        yield c


def _completion(**fields) -> dict:
    return {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4, **fields}


def _chat(**fields) -> dict:
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        **fields,
    }


def _generate(sampling: dict | None = None, **fields) -> dict:
    return {"text": "Hello", "sampling_params": {"max_new_tokens": 4, **(sampling or {})}, **fields}


def _post(http: httpx.Client, path: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return http.post(path, content=content, headers={"content-type": "application/json"})


def _assert_400(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 400, f"{r.status_code}: {r.text[:500]}"
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    for w in words:
        assert w in error["message"], error
    return error["message"]


OUT_OF_RANGE = [
    ("/v1/completions", _completion(prompt=[-1]), "token id -1"),
    ("/v1/completions", _completion(prompt=[2**70]), f"token id {2**70}"),
    ("/v1/completions", _completion(prompt=[[1, 2], [3, -5]]), "token id -5"),
    ("/generate", {"input_ids": [-1]}, "token id -1"),
    ("/generate", {"input_ids": [2**70]}, f"token id {2**70}"),
    ("/v1/completions", _completion(seed=2**80), "seed"),
    ("/v1/chat/completions", _chat(seed=2**80), "seed"),
    ("/generate", _generate({"seed": 2**80}), "seed"),
    ("/v1/completions", _completion(seed=-(2**64)), "seed"),
    ("/v1/completions", _completion(top_k=2**70), "top_k"),
    ("/v1/completions", _completion(min_tokens=2**70), "min_tokens"),
    ("/v1/completions", _completion(stop_token_ids=[2**70]), "stop_token_ids"),
    ("/v1/chat/completions", _chat(stop_token_ids=[-3]), "stop_token_ids"),
    ("/generate", _generate({"top_k": 2**70}), "top_k"),
    ("/generate", _generate({"max_new_tokens": "many"}), "max_new_tokens"),
    ("/generate", _generate({"n": 10**6}), "sampling_params.n"),
]


@pytest.mark.parametrize(
    ("path", "body", "names"), OUT_OF_RANGE, ids=[f"{p}-{w}" for p, _, w in OUT_OF_RANGE]
)
def test_out_of_range_numbers_are_400(http, path, body, names):
    _assert_400(_post(http, path, body), names)


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_floats_are_400_naming_the_field(http, field, value):
    # Written as raw JSON text: these literals are what a client's json.dumps(float("nan")) sends.
    completion = json.dumps(_completion(**{field: 0.5})).replace("0.5", value)
    chat = json.dumps(_chat(**{field: 0.5})).replace("0.5", value)
    native = json.dumps(_generate({field: 0.5})).replace("0.5", value)
    for path, body in (
        ("/v1/completions", completion),
        ("/v1/chat/completions", chat),
        ("/generate", native),
    ):
        _assert_400(_post(http, path, body), field, "finite")


def _escaped(body: dict, escape: str) -> str:
    """`body` as JSON text with "@@" replaced by a raw JSON escape (json.dumps cannot write a lone one)."""
    return json.dumps(body).replace("@@", escape)


LONE_SURROGATE = [
    ("/v1/completions", _escaped(_completion(prompt="Hi @@ there"), r"\ud800"), "prompt"),
    ("/v1/completions", _escaped(_completion(prompt=["ok", "@@"]), r"\udc00"), "prompt[1]"),
    (
        "/v1/chat/completions",
        _escaped(_chat(messages=[{"role": "user", "content": "@@"}]), r"\ud83d"),
        "messages[0].content",
    ),
    ("/generate", _escaped(_generate(text="@@"), r"\ud800"), "text"),
    ("/v1/completions", _escaped(_completion(stop=["@@"]), r"\ud800"), "stop[0]"),
    ("/v1/completions", _escaped(_completion(rid="@@"), r"\udfff"), "rid"),
]


@pytest.mark.parametrize(
    ("path", "body", "field"), LONE_SURROGATE, ids=[f"{p}-{f}" for p, _, f in LONE_SURROGATE]
)
def test_lone_surrogate_is_the_users_input_problem(http, path, body, field):
    message = _assert_400(_post(http, path, body), field, "surrogate")
    assert "TextEncodeInput" not in message and "codec" not in message, message


def test_a_paired_surrogate_is_text(http):
    # The same escape with its low half is an ordinary character (an emoji): accepted.
    r = _post(http, "/v1/completions", _escaped(_completion(prompt="Hi @@"), r"\ud83d\ude00"))
    assert r.status_code == 200, r.text


def test_nothing_is_left_in_flight_after_bad_input(served, http):
    # Every request above failed after or before registration; none may stay registered (the server's
    # teardown then checks that an idle SIGTERM stops it within seconds).
    assert inflight(served) == 0
