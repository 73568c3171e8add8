"""Every request field a real server accepts is honoured or refused with a 400 naming it (issue 16's
examples): unknown fields, tool choice, output constraints, logprobs beyond what is returned, logit bias,
/generate's SGLang fields, max_tokens past the context; and --skip-tokenizer-init answers with token ids,
--preferred-sampling-params between the endpoint's defaults and the request's own values.

Most checks share the session server (tests/server/conftest.py); one more server covers the start-up
flags (skip-tokenizer-init, preferred max_new_tokens, no-effect flags).
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import SERVED_NAME
from tests.server.server_proc import served

PROMPT_IDS = [5, 9, 17, 33, 65, 7]
CONTEXT = 512  # the tiny model's max_position_embeddings
GREEDY = {"temperature": 0, "ignore_eos": True}


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, headers=srv.headers, timeout=60)


def _refused(r: httpx.Response, field: str) -> str:
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert field in message, message
    return message


def _chat(**fields) -> dict:
    return {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **fields}


def _completion(**fields) -> dict:
    return {"model": SERVED_NAME, "prompt": PROMPT_IDS, "max_tokens": 3, **fields}


@pytest.mark.parametrize("field", ["foo_bar", "lora_path", "best_of_n", "guided_decoding_backend"])
def test_unknown_fields_are_refused_by_name(server, field):
    _refused(_post(server, "/v1/completions", _completion(**{field: 1})), field)
    _refused(_post(server, "/v1/chat/completions", _chat(**{field: 1})), field)


@pytest.mark.parametrize("options", [{"continuous_usage_stats": True}, {"include_usage": True, "foo": 1}])
def test_stream_options_not_sent_are_refused(server, options):
    body = _completion(stream=True, stream_options=options)
    _refused(_post(server, "/v1/completions", body), next(k for k in options if k != "include_usage"))


def test_informational_fields_are_accepted(server):
    extra = {"user": "u-1", "metadata": {"team": "a"}, "store": False}
    assert _post(server, "/v1/completions", _completion(**extra)).status_code == 200
    assert _post(server, "/v1/chat/completions", _chat(**extra)).status_code == 200


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize(
    "choice", [None, "auto", "required", {"type": "function", "function": {"name": "f"}}]
)
def test_tool_choice_needs_its_parser_or_the_grammar_backend(server, choice):
    # the session server runs without --tool-call-parser (auto) and --grammar-backend (required, named):
    # tool calls it could not produce are a 400 naming what to start it with, never plain text
    body = _chat(tools=TOOLS) if choice is None else _chat(tools=TOOLS, tool_choice=choice)
    message = _refused(_post(server, "/v1/chat/completions", body), "tool_choice")
    assert ("--tool-call-parser" if choice in (None, "auto") else "--grammar-backend xgrammar") in message


def test_tools_with_tool_choice_none_are_served(server):
    r = _post(server, "/v1/chat/completions", _chat(tools=TOOLS, tool_choice="none"))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": {"type": "object"}},
        {"guided_regex": "[ab]+"},
        {"regex": "[ab]+"},
        {"ebnf": 'root ::= "a"'},
        {"guided_choice": ["yes", "no"]},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            }
        },
    ],
    ids=lambda e: next(iter(e)),
)
def test_output_constraints_need_the_grammar_backend(server, extra):
    # the session server runs with --grammar-backend none: a constraint is a 400, never ignored
    r = _post(server, "/v1/chat/completions", _chat(**extra))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "structured output" in message or next(iter(extra)) in message, message


def _honoured_or_refused(r: httpx.Response, field: str) -> bool:
    """True when the server honoured the field (the caller checks how), False when it refused it by name."""
    if r.status_code == 400:
        _refused(r, field)
        return False
    assert r.status_code == 200, r.text
    return True


def test_completions_logprobs_n_returns_n_alternatives(server):
    r = _post(server, "/v1/completions", _completion(logprobs=5, **GREEDY))
    if not _honoured_or_refused(r, "logprobs"):
        return
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 3
    # OpenAI's legacy shape maps token text to logprob: alternatives that decode alike share one key
    tops = lp["top_logprobs"]
    assert (
        tops is not None and all(1 <= len(alts) <= 5 for alts in tops) and any(len(a) == 5 for a in tops)
    ), lp


def test_generate_top_logprobs_num_is_honoured_and_lora_path_refused(server):
    body = {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 2, **GREEDY},
        "return_logprob": True,
    }
    _refused(_post(server, "/generate", {**body, "lora_path": "adapter"}), "lora_path")
    _refused(_post(server, "/generate", {"input_ids": PROMPT_IDS, "sampling_params": {"lora": 1}}), "lora")
    r = _post(server, "/generate", {**body, "top_logprobs_num": 3})
    if _honoured_or_refused(r, "top_logprobs_num"):
        tops = r.json()["meta_info"]["output_top_logprobs"]
        assert len(tops) == 2 and all(len(alts) == 3 for alts in tops)


def _first_token(srv, bias: dict | None = None) -> int | None:
    """The greedy first token, or None when the server refuses logit_bias by name."""
    params = {"max_new_tokens": 1, **GREEDY, **({"logit_bias": bias} if bias else {})}
    r = _post(srv, "/generate", {"input_ids": PROMPT_IDS, "sampling_params": params})
    return r.json()["output_ids"][0] if _honoured_or_refused(r, "logit_bias") else None


def test_logit_bias_moves_the_greedy_token(server, tiny_model):
    from transformers import AutoTokenizer

    natural = _first_token(server)
    forced = 42 if natural != 42 else 43
    body = _completion(max_tokens=1, logit_bias={str(forced): 100}, **GREEDY)
    honoured = _honoured_or_refused(_post(server, "/v1/completions", body), "logit_bias")
    if _first_token(server, {str(forced): 100}) is None:
        assert not honoured  # refused on both routes alike
        return
    assert _first_token(server, {str(forced): 100}) == forced
    assert _first_token(server, {str(natural): -100}) != natural
    r = _post(server, "/v1/completions", body)
    assert r.json()["choices"][0]["text"] == AutoTokenizer.from_pretrained(tiny_model).decode([forced])


def test_suffix_is_refused(server):
    _refused(_post(server, "/v1/completions", _completion(suffix="tail")), "suffix")


def test_max_tokens_past_the_context_is_a_400(server):
    r = _post(server, "/v1/completions", _completion(max_tokens=CONTEXT))
    message = _refused(r, "max_tokens")
    assert r.json()["error"]["param"] == "max_tokens" and f"at most {CONTEXT - len(PROMPT_IDS)}" in message
    _refused(_post(server, "/v1/chat/completions", _chat(max_tokens=10 * CONTEXT)), "max_tokens")
    r = _post(server, "/generate", {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": CONTEXT}})
    _refused(r, "max_new_tokens")
    # exactly what fits is served
    ok = _post(server, "/v1/completions", _completion(max_tokens=CONTEXT - len(PROMPT_IDS), temperature=0))
    assert ok.status_code == 200, ok.text


@pytest.fixture(scope="module")
def ids_server(tiny_model, tmp_path_factory):
    """No tokenizer, a preferred max_new_tokens of 5, and two flags this build accepts with no effect."""
    with served(
        tiny_model,
        tmp_path_factory.mktemp("ids-server"),
        "--skip-tokenizer-init",
        "--preferred-sampling-params", json.dumps({"max_new_tokens": 5, "ignore_eos": True}),
        "--disable-tf32",
        "--enable-nvtx",
    ) as srv:  # fmt: skip
        yield srv


def test_skip_tokenizer_init_answers_with_token_ids(ids_server):
    body = {"prompt": PROMPT_IDS, "temperature": 0}
    r = _post(ids_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    # the preferred max_new_tokens (5) beats the completions default (16)
    assert choice["text"] == "" and len(choice["token_ids"]) == 5
    native = _post(ids_server, "/generate", {"input_ids": PROMPT_IDS, "sampling_params": {"temperature": 0}})
    assert native.json()["output_ids"] == choice["token_ids"]
    # the request's own max_tokens beats the preferred one
    r = _post(ids_server, "/v1/completions", {**body, "max_tokens": 2})
    assert r.json()["choices"][0]["token_ids"] == choice["token_ids"][:2]
    streamed: list[int] = []
    with httpx.stream(
        "POST", f"{ids_server.url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    streamed += c.get("token_ids", [])
    assert streamed == choice["token_ids"]


def test_no_effect_flags_are_one_warning_and_in_server_info(ids_server):
    info = ids_server.server_info()
    assert info["no_effect_flags"] == ["--disable-tf32", "--enable-nvtx"]
    lines = [line for line in ids_server.log().splitlines() if "accepted with no effect" in line]
    assert len(lines) == 1 and "WARNING" in lines[0]
    assert "--disable-tf32" in lines[0] and "--enable-nvtx" in lines[0]


def test_chat_without_a_tokenizer_is_a_400_not_an_empty_answer(ids_server):
    r = _post(ids_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"], r.text
