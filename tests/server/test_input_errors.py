"""Bad input a real server used to accept silently, or answer with a 500 or a source path, is a 400 naming
the field the client sent (issue 30, items 4 and 5).

- A prompt longer than the context is a 400 on every generating route, streamed or not: text longer than
  the context can spell (refused before tokenizing) and text that tokenizes past it. /generate let the
  first escape as a 500.
- No error message carries a source path or a traceback (an empty body's did).
- Strict types, closed role set, content and tool_call_id where a template needs them, stream_options
  only with stream, min_tokens <= max_tokens, tool schemas that are JSON schemas; `param` names the field.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import SERVED_NAME

CONTEXT = 512  # the tiny model's max_position_embeddings
# More characters than 512 tokens of this vocabulary can spell: refused before it is tokenized.
TOO_MANY_CHARS = "word " * 20_000
# Few enough characters to be tokenized, more tokens than the context holds.
TOO_MANY_TOKENS = "the cat sat on the mat. " * 200


def _post(srv, path: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {**srv.headers, "content-type": "application/json"}
    return httpx.post(f"{srv.url}{path}", content=content, headers=headers, timeout=120)


def _error(r: httpx.Response, param: str | None) -> dict:
    assert r.status_code == 400, f"{r.status_code}: {r.text[:500]}"
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert "File \"" not in error["message"] and "Traceback" not in error["message"], error
    assert ".py" not in error["message"], error
    return error


def _routes(text: str) -> list[tuple[str, dict, str]]:
    out = []
    for stream in (False, True):
        out += [
            ("/generate", {"text": text, "sampling_params": {"max_new_tokens": 4}, "stream": stream}, "text"),
            ("/generate", {"text": [text], "sampling_params": {"max_new_tokens": 4}, "stream": stream}, "text"),
            ("/v1/completions", {"model": SERVED_NAME, "prompt": text, "max_tokens": 4, "stream": stream},
             "prompt"),
            ("/v1/completions", {"model": SERVED_NAME, "prompt": [text], "max_tokens": 4, "stream": stream},
             "prompt"),
            ("/v1/chat/completions", {"model": SERVED_NAME, "messages": [{"role": "user", "content": text}],
                                      "max_tokens": 4, "stream": stream}, "messages"),
        ]  # fmt: skip
    return out


@pytest.mark.parametrize("kind", ["chars", "tokens"])
def test_an_over_long_prompt_is_400_on_every_generating_route(server, kind):
    text = TOO_MANY_CHARS if kind == "chars" else TOO_MANY_TOKENS
    for path, body, param in _routes(text):
        r = _post(server, path, body)
        assert r.status_code == 400, f"{path} stream={body['stream']}: {r.status_code} {r.text[:300]}"
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded", (path, error)
        assert error["param"] in (param, "prompt"), (path, error)  # a tokenized prompt is checked as one


@pytest.mark.parametrize("body", ["", "[]", "3"])
def test_a_body_that_is_not_an_object_names_no_source_file(server, body):
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        r = _post(server, path, body)
        _error(r, None)


def _chat(**fields) -> dict:
    return {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **fields}


def _completion(**fields) -> dict:
    return {"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 3, **fields}


TOOLS_BAD_SCHEMA = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]
SILENTLY_ACCEPTED = [
    ("role-wizard", "/v1/chat/completions", _chat(messages=[{"role": "wizard", "content": "Hi"}]),
     "messages[0].role"),
    ("min-over-max", "/v1/completions", _completion(min_tokens=5), "min_tokens"),
    ("min-over-max-chat", "/v1/chat/completions", _chat(max_completion_tokens=2, min_tokens=3), "min_tokens"),
    ("min-over-max-native", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2,
                                          "min_new_tokens": 3}}, "sampling_params.min_new_tokens"),
    ("stream-options-no-stream", "/v1/completions", _completion(stream_options={"include_usage": True}),
     "stream_options"),
    ("stream-options-no-stream-chat", "/v1/chat/completions", _chat(stream_options={"include_usage": True}),
     "stream_options"),
    ("tool-schema-nope", "/v1/chat/completions", _chat(tools=TOOLS_BAD_SCHEMA, tool_choice="none"),
     "tools[0].function.parameters.type"),
    ("tool-type-nope", "/v1/chat/completions", _chat(tools=[{"type": "nope"}], tool_choice="none"),
     "tools[0]"),
    ("user-content-null", "/v1/chat/completions", _chat(messages=[{"role": "user", "content": None}]),
     "messages[0].content"),
    ("tool-without-id", "/v1/chat/completions",
     _chat(messages=[{"role": "user", "content": "Hi"}, {"role": "tool", "content": "42"}]),
     "messages[1].tool_call_id"),
    ("stream-yes", "/v1/completions", _completion(stream="yes"), "stream"),
    ("stream-yes-chat", "/v1/chat/completions", _chat(stream="yes"), "stream"),
    ("stream-yes-native", "/generate", {"text": "Hi", "stream": "yes"}, "stream"),
    ("max-tokens-true", "/v1/completions", _completion(max_tokens=True), "max_tokens"),
    ("max-tokens-true-chat", "/v1/chat/completions", _chat(max_tokens=True), "max_tokens"),
    ("max-new-tokens-true", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": True}},
     "sampling_params.max_new_tokens"),
    ("temperature-string", "/v1/completions", _completion(temperature="0.5"), "temperature"),
    ("temperature-string-chat", "/v1/chat/completions", _chat(temperature="0.5"), "temperature"),
    ("max-tokens-minus-one", "/v1/completions", _completion(max_tokens=-1), "max_tokens"),
    ("max-tokens-minus-one-chat", "/v1/chat/completions", _chat(max_tokens=-1), "max_tokens"),
    ("max-completion-tokens-minus-one", "/v1/chat/completions", _chat(max_completion_tokens=-1),
     "max_completion_tokens"),
    ("min-tokens-minus-one", "/v1/completions", _completion(min_tokens=-1), "min_tokens"),
    # 400s that used to carry param null
    ("n-zero", "/v1/completions", _completion(n=0), "n"),
    ("top-p-zero", "/v1/completions", _completion(top_p=0), "top_p"),
    ("top-k-zero", "/v1/chat/completions", _chat(top_k=0), "top_k"),
    ("stop-too-many", "/v1/completions", _completion(stop=[str(i) for i in range(17)]), "stop"),
    ("suffix", "/v1/completions", _completion(suffix="x"), "suffix"),
    ("best-of", "/v1/completions", _completion(n=1, best_of=2), "best_of"),
    ("top-logprobs-alone", "/v1/chat/completions", _chat(top_logprobs=2), "top_logprobs"),
    ("tool-choice-without-tools", "/v1/chat/completions", _chat(tool_choice="required"), "tool_choice"),
    ("prompt-wrong-type", "/v1/completions", _completion(prompt=[1, "a"]), "prompt"),
    ("prompt-empty-list", "/v1/completions", _completion(prompt=[]), "prompt"),
    ("prompt-empty-string", "/v1/completions", _completion(prompt=""), "prompt"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "param"), [c[1:] for c in SILENTLY_ACCEPTED], ids=[c[0] for c in SILENTLY_ACCEPTED]
)
def test_bad_input_is_400_naming_the_field_sent(server, path, body, param):
    error = _error(_post(server, path, body), param)
    assert param.split("[")[0].split(".")[-1] in error["message"] or param in error["message"], error
    assert "max_new_tokens" not in error["message"] or path == "/generate", error


def test_what_stays_valid(server):
    # integers are numbers, an assistant turn that calls a tool has no content, a tool turn with its id
    ok = _post(server, "/v1/completions", _completion(temperature=1, top_p=1))
    assert ok.status_code == 200, ok.text
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]  # fmt: skip
    ok = _post(server, "/v1/chat/completions", _chat(messages=turns))
    assert ok.status_code == 200, ok.text
