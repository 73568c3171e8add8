"""What third-party clients send and expect, on a real server (the demo model) driven by the official
`openai` client and plain HTTP:

- newer OpenAI fields are accepted, and those that change nothing are named in a response header and
  logged once; legacy `functions` / `function_call` are served as tools; vLLM's extras
  (`include_stop_str_in_output`, `structured_outputs`, `continue_final_message`, chat `echo`) work;
- structured output and output logprobs are on without any flag, and `--grammar-backend none` /
  `--disable-output-logprobs` turn them off;
- hermes tool calls give the same `content` streamed and whole, and a `required` tool choice cut off by
  `max_tokens` returns the calls it completed.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.server.server_proc import module_server, served
from tests.server.tool_defs import ASK, TIME, TOOLS, WEATHER
from tokenspeed.demo_models import DEMO_MODELS

MODEL = str(DEMO_MODELS[0].path)
IGNORED_HEADER = "x-tokenspeed-ignored-fields"


# no --grammar-backend, no --enable-output-logprobs: the defaults a client meets
srv = module_server(
    MODEL, "client-fields-logs",
    "--served-model-name", "demo",
    "--tool-call-parser", "hermes",
    "--disable-any-whitespace",
)  # fmt: skip


def _post(srv, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json={"model": "demo", **body}, timeout=120, **kw)


# ---- item 6: defaults ---------------------------------------------------------------------------------
def test_structured_output_and_logprobs_are_on_by_default(client):
    r = client.chat.completions.create(
        model="demo", messages=ASK, max_tokens=5, logprobs=True, top_logprobs=2,
        extra_body={"guided_choice": ["yes", "no"]},
    )  # fmt: skip
    ch = r.choices[0]
    assert ch.message.content in ("yes", "no")
    assert "".join(e.token for e in ch.logprobs.content).startswith(ch.message.content)  # then EOS
    assert all(len(e.top_logprobs) == 2 for e in ch.logprobs.content)


def test_grammar_backend_none_and_disable_output_logprobs_turn_them_off(tmp_path):
    args = ("--served-model-name", "demo", "--grammar-backend", "none", "--disable-output-logprobs")
    with served(MODEL, tmp_path, *args) as s:
        r = _post(s, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "logprobs": True})
        assert r.status_code == 400 and "--disable-output-logprobs" in r.json()["error"]["message"]
        r = _post(s, "/v1/completions", {"prompt": "x", "max_tokens": 2, "logprobs": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
        body = {"prompt": "x", "max_tokens": 2, "structured_outputs": {"choice": ["a"]}}
        r = _post(s, "/v1/completions", body)
        assert r.status_code == 400 and "--grammar-backend xgrammar" in r.json()["error"]["message"]


# ---- item 5: OpenAI's newer fields, legacy functions, vLLM's extras ---------------------------------
NEWER = {
    "service_tier": "auto",
    "reasoning_effort": "low",
    "prediction": {"type": "content", "content": "It is sunny"},
    "modalities": ["text", "audio"],
    "verbosity": "low",
    "prompt_cache_key": "k-1",
    "safety_identifier": "u-42",
}


def test_newer_openai_fields_are_accepted_and_reported_once(srv, client):
    r = client.chat.completions.with_raw_response.create(
        model="demo", messages=ASK, max_tokens=3, **NEWER
    )
    assert r.http_response.status_code == 200 and r.parse().choices[0].message.content is not None
    reported = r.headers[IGNORED_HEADER].split(", ")
    assert reported == [
        "safety_identifier", "prompt_cache_key", "service_tier", "reasoning_effort", "prediction",
        "modalities", "verbosity",
    ]  # fmt: skip
    # streamed, with include_obfuscation; modalities ["text"] is what the server does, so not reported
    body = {"messages": ASK, "max_tokens": 3, "stream": True, "modalities": ["text"], "service_tier": "flex",
            "stream_options": {"include_usage": True, "include_obfuscation": False}}  # fmt: skip
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={"model": "demo", **body}, timeout=120) as s:
        assert s.status_code == 200
        assert s.headers[IGNORED_HEADER] == "stream_options.include_obfuscation, service_tier"
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["usage"]["completion_tokens"] > 0
    r = _post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2, "prompt_cache_key": "k"})
    assert r.status_code == 200 and r.headers[IGNORED_HEADER] == "prompt_cache_key"
    # a request sending none of them has no header
    r = _post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2, "user": "u"})
    assert r.status_code == 200 and IGNORED_HEADER not in r.headers
    # logged once per server, however many requests send it
    warnings = [line for line in srv.log().splitlines() if "accepted with no effect" in line]
    assert sum("service_tier" in line for line in warnings) == 1, warnings
    assert any("prompt_cache_key" in line and "radix" in line for line in warnings), warnings


def test_legacy_functions_are_served_as_tools(client):
    kw = dict(model="demo", messages=ASK, functions=[WEATHER, TIME], max_tokens=60, temperature=1, seed=3)
    r = client.chat.completions.create(**kw, function_call={"name": "get_weather"})
    msg, finish = r.choices[0].message, r.choices[0].finish_reason
    assert finish == "function_call" and msg.tool_calls is None
    assert msg.function_call.name == "get_weather"
    assert set(json.loads(msg.function_call.arguments)) == {"city", "days"}
    stream = client.chat.completions.create(**kw, function_call={"name": "get_weather"}, stream=True)
    name, arguments, finish = None, "", None
    for chunk in stream:
        call = chunk.choices[0].delta.function_call
        if call is not None:
            name = call.name or name
            arguments += call.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == ("get_weather", msg.function_call.arguments, "function_call")
    # function_call "none": the functions are shown, the answer is text
    r = client.chat.completions.create(**kw, function_call="none")
    assert r.choices[0].message.function_call is None and r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="functions: give tools and tool_choice or the legacy"):
        client.chat.completions.create(**kw, tools=TOOLS)


def test_include_stop_str_in_output(client):
    kw = dict(model="demo", prompt="The list of", max_tokens=24, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    stop = full[6:9]
    assert len(stop) == 3 and full.find(stop) == 6, full
    cut = client.completions.create(**kw, stop=[stop]).choices[0]
    assert cut.text == full[:6] and cut.finish_reason == "stop"
    extra = {"include_stop_str_in_output": True}
    kept = client.completions.create(**kw, stop=[stop], extra_body=extra).choices[0]
    assert kept.text == full[:9] and kept.finish_reason == "stop"
    streamed = client.completions.create(**kw, stop=[stop], extra_body=extra, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == full[:9]


def test_structured_outputs_spellings(srv, client):
    cases = [
        ({"choice": ["alpha", "beta"]}, r"alpha|beta"),
        ({"regex": "[a-z]{3}-[0-9]{2}"}, r"[a-z]{3}-[0-9]{2}"),
        ({"grammar": 'root ::= "ab" | "cd"'}, r"ab|cd"),
        ({"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
         r'\{"n": ?-?[0-9]+\}'),
    ]  # fmt: skip
    for spec, pattern in cases:
        r = client.chat.completions.create(
            model="demo", messages=ASK, max_tokens=20, extra_body={"structured_outputs": spec}
        )
        assert re.fullmatch(pattern, r.choices[0].message.content), (spec, r.choices[0].message.content)
    r = client.completions.create(
        model="demo", prompt="x", max_tokens=8, extra_body={"structured_outputs": {"choice": ["one", "two"]}}
    )
    assert r.choices[0].text in ("one", "two")
    # vLLM's backend hints change nothing here: accepted and reported
    body = {"prompt": "x", "max_tokens": 3, "structured_outputs": {"regex": "[0-9]+", "disable_fallback": True}}
    r = _post(srv, "/v1/completions", body)
    assert r.status_code == 200 and r.headers[IGNORED_HEADER] == "structured_outputs.disable_fallback"
    with pytest.raises(openai.BadRequestError, match="structured_outputs.regex and structured_outputs.choice"):
        client.completions.create(
            model="demo", prompt="x", max_tokens=3, extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}}
        )
    with pytest.raises(openai.BadRequestError, match="structural_tag"):
        client.completions.create(
            model="demo", prompt="x", max_tokens=3, extra_body={"structured_outputs": {"structural_tag": "{}"}}
        )


def test_continue_final_message_and_chat_echo(client):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The list of"}]
    kw = dict(model="demo", messages=messages, max_tokens=12, temperature=0)
    tok = AutoTokenizer.from_pretrained(MODEL)
    open_turn = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert open_turn.endswith("assistant\nThe list of")
    extra = {"continue_final_message": True, "echo": True}
    r = client.chat.completions.create(**kw, extra_body=extra)
    assert r.usage.prompt_tokens == len(tok.encode(open_turn, add_special_tokens=False))
    whole = r.choices[0].message.content
    assert whole.startswith("The list of") and len(whole) > len("The list of")
    # the same prompt through completions: the continuation is the same text
    cont = client.completions.create(model="demo", prompt=open_turn, max_tokens=12, temperature=0)
    assert whole == "The list of" + cont.choices[0].text
    streamed = client.chat.completions.create(**kw, extra_body=extra, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == whole
    # without echo the answer is the continuation alone; without continue the turn is closed first
    r = client.chat.completions.create(**kw, extra_body={"continue_final_message": True})
    assert r.choices[0].message.content == cont.choices[0].text
    closed = client.chat.completions.create(**kw)
    assert closed.usage.prompt_tokens > len(tok.encode(open_turn, add_special_tokens=False))
    with pytest.raises(openai.BadRequestError, match="continue_final_message: the last message must be"):
        client.chat.completions.create(
            model="demo", messages=messages[:1], max_tokens=2, extra_body={"continue_final_message": True}
        )
    with pytest.raises(openai.BadRequestError, match="set add_generation_prompt false"):
        client.chat.completions.create(
            **kw, extra_body={"continue_final_message": True, "add_generation_prompt": True}
        )


# ---- item 7: tool calls -------------------------------------------------------------------------------
# What a Qwen model answers when it says something, then calls two tools (the demo model is held to it).
TWO_CALLS = (
    r'Sure\. <tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,6}", "days": [1-7]\}\}\n'
    r'</tool_call>\n<tool_call>\n\{"name": "get_time", "arguments": \{"tz": "(UTC|CET)"\}\}\n</tool_call>'
)


def test_hermes_content_is_the_same_streamed_and_whole(client):
    kw = dict(model="demo", messages=ASK, tools=TOOLS, max_tokens=400, temperature=1, seed=5,
              extra_body={"guided_regex": TWO_CALLS})  # fmt: skip
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert msg.content == "Sure." and r.choices[0].finish_reason == "tool_calls"
    whole = [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert [name for name, _ in whole] == ["get_weather", "get_time"]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, [tc.function.name, ""])
            entry[1] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    # no trailing space before the first call, no newline between the calls
    assert content == "Sure." and finish == "tool_calls"
    assert [tuple(calls[i]) for i in sorted(calls)] == whole


def _required(client, seed: int, max_tokens: int, stream: bool = False):
    kw = dict(model="demo", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1, seed=seed,
              max_tokens=max_tokens)  # fmt: skip
    if not stream:
        return client.chat.completions.create(**kw, logprobs=True)
    calls, finish = {}, None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for tc in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(tc.index, [tc.function.name, ""])
            entry[1] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish


def test_required_tool_choice_cut_off_keeps_its_complete_calls(client):
    # an answer of two calls or more (seeded samples; the grammar lets the model stop after any call)
    for seed in range(40):
        full = _required(client, seed, 200)
        if full.choices[0].finish_reason == "tool_calls" and len(full.choices[0].message.tool_calls) >= 2:
            break
    else:
        pytest.fail("no seed gave two calls")
    calls = [(c.function.name, c.function.arguments) for c in full.choices[0].message.tool_calls]
    tokens = [e.token for e in full.choices[0].logprobs.content]
    while "]" not in tokens[-1]:
        tokens.pop()  # the end-of-text token after the array
    text = "".join(tokens)
    assert [json.loads(text)[i]["name"] for i in range(len(calls))] == [name for name, _ in calls]
    # cut inside the last call: a few characters past where it starts
    inside = text.rfind('{"name"') + 4
    cut = next(k for k in range(len(tokens)) if len("".join(tokens[: k + 1])) > inside)
    r = _required(client, seed, cut)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == cut
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == calls[:-1]
    assert _required(client, seed, cut, stream=True) == (calls[:-1], "length")
    # cut before the closing bracket: every call is complete
    r = _required(client, seed, len(tokens) - 1)
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == calls
