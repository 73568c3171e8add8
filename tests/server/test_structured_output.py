"""Structured output, tool calls, reasoning, logit bias and top logprobs on a real server (the demo model), through the official
`openai` client and /generate.

One server serves every check: xgrammar on, overlap scheduling on (so grammar requests run next to the
overlapped ones) and small prefill chunks (so prompts are computed in several chunks before sampling).
The "every constrained output parses" checks run again on a second server with `--grammar-backend
llguidance` (the `grammar` fixture), on fewer samples; what only one backend does has its own test.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import httpx
import openai
import pytest
import torch

from tests.server.server_proc import ServerProc, module_server, served
from tests.server.tool_defs import ASK, TOOLS
from tokenspeed.demo_models import DEMO_MODELS

MODEL = str(DEMO_MODELS[0].path)
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
# Qwen3's switch for its thinking section, which the reasoning parser and the grammar honour
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}


srv = module_server(
    MODEL, "structured-logs",
    "--served-model-name", "demo",
    "--grammar-backend", "xgrammar",
    "--disable-any-whitespace",
    "--enable-output-logprobs",
    "--chunked-prefill-size", "8",
    "--tool-call-parser", "hermes",
    "--reasoning-parser", "qwen3",
)  # fmt: skip


@pytest.fixture(scope="module")
def llguidance_srv(tmp_path_factory):
    pytest.importorskip("llguidance")  # the test extra installs it; a hand-made environment may lack it
    with served(
        MODEL,
        tmp_path_factory.mktemp("llguidance-logs"),
        "--served-model-name", "demo",
        "--grammar-backend", "llguidance",
        "--disable-any-whitespace",
        "--reasoning-parser", "qwen3",
    ) as s:  # fmt: skip
        yield s


@dataclass(frozen=True)
class Grammar:
    """A grammar backend's server, its client, and how many samples a parse check draws from it."""

    backend: str
    srv: ServerProc
    client: openai.OpenAI
    samples: int


# xgrammar is the default and carries the full sample counts; llguidance repeats its checks on fewer.
SAMPLES = {"xgrammar": 100, "llguidance": 20}


@pytest.fixture(scope="module", params=list(SAMPLES))
def grammar(request) -> Grammar:
    s = request.getfixturevalue("srv" if request.param == "xgrammar" else "llguidance_srv")
    return Grammar(request.param, s, s.openai_client(), SAMPLES[request.param])


def _matches(schema: dict, value) -> bool:
    """Enough of JSON Schema for PERSON: types, required keys, no extras, bounds, enums."""
    if set(value) != set(schema["required"]):
        return False
    p = schema["properties"]
    return (
        isinstance(value["name"], str) and len(value["name"]) <= 8
        and isinstance(value["age"], int) and 0 <= value["age"] <= 99
        and isinstance(value["ok"], bool)
        and isinstance(value["tags"], list) and len(value["tags"]) <= 3
        and all(t in p["tags"]["items"]["enum"] for t in value["tags"])
    )  # fmt: skip


def test_json_schema_seeded_samples_all_match(grammar):
    r = grammar.client.completions.create(
        model="demo", prompt="A person as JSON:", max_tokens=200, temperature=1, seed=7, n=grammar.samples,
        extra_body={"guided_json": PERSON},
    )  # fmt: skip
    assert len(r.choices) == grammar.samples
    for ch in r.choices:
        assert ch.finish_reason == "stop", ch.text
        assert _matches(PERSON, json.loads(ch.text)), ch.text
    # temperature 1: the samples differ (the grammar constrains, it does not pick)
    assert len({ch.text for ch in r.choices}) > grammar.samples // 4


def test_json_schema_after_the_reasoning_section(client):
    # xgrammar with --reasoning-parser qwen3: the schema holds the answer after an optional <think>
    # section, which goes to reasoning_content
    r = client.chat.completions.create(
        model="demo", messages=MESSAGES, max_tokens=200, temperature=1, seed=7, n=20,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )  # fmt: skip
    done = [ch.message for ch in r.choices if ch.finish_reason == "stop"]
    assert done
    for msg in done:
        assert _matches(PERSON, json.loads(msg.content)), msg
    for ch in r.choices:
        if ch.finish_reason == "length":  # the random model opened <think> and was cut off still in it
            assert ch.message.reasoning_content and not ch.message.content, ch.message


def test_regex_ebnf_and_choice_samples_all_match(grammar):
    pattern = r"[a-z]{2,6}-[0-9]{1,3}"
    ebnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9]+ | "x"'
    for extra, check in (
        ({"guided_regex": pattern}, lambda t: re.fullmatch(pattern, t)),
        ({"guided_grammar": ebnf}, lambda t: re.fullmatch(r"\((?:[0-9]+|x)(?:,(?:[0-9]+|x))*\)", t)),
        ({"guided_choice": ["yes", "no way", "a.b"]}, lambda t: t in ("yes", "no way", "a.b")),
    ):
        r = grammar.client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=64, temperature=1, seed=3, n=grammar.samples,
            extra_body=extra,
        )  # fmt: skip
        bad = [
            ch.message.content
            for ch in r.choices
            if ch.finish_reason != "stop" or not check(ch.message.content)
        ]
        assert not bad, (extra, bad[:5])


def test_json_object_and_streaming(grammar):
    client = grammar.client
    stream = client.chat.completions.create(
        model="demo", messages=MESSAGES, max_tokens=200, temperature=0, stream=True, extra_body=NO_THINKING,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert _matches(PERSON, json.loads(text))
    r = client.chat.completions.create(
        model="demo", messages=MESSAGES, max_tokens=300, temperature=1, seed=1, n=8, extra_body=NO_THINKING,
        response_format={"type": "json_object"},
    )  # fmt: skip
    done = [ch.message.content for ch in r.choices if ch.finish_reason == "stop"]
    assert all(ch.message.content.startswith("{") for ch in r.choices)  # no <think> section
    assert done and all(isinstance(json.loads(t), dict) for t in done)


def test_completions_and_generate_constraints(grammar):
    srv, client = grammar.srv, grammar.client
    r = client.completions.create(
        model="demo", prompt="The answer:", max_tokens=32, temperature=1, seed=5, n=10,
        extra_body={"guided_json": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}},
    )  # fmt: skip
    for ch in r.choices:
        value = json.loads(ch.text)
        assert isinstance(value, list) and 1 <= len(value) <= 3 and all(isinstance(v, int) for v in value)
    body = {"text": "Code:", "sampling_params": {"max_new_tokens": 16, "temperature": 1, "regex": "[A-F]{4}"}}
    out = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    assert re.fullmatch("[A-F]{4}", out["text"]), out
    body["sampling_params"] = {"max_new_tokens": 64, "json_schema": json.dumps(PERSON)}
    out = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    assert _matches(PERSON, json.loads(out["text"])), out


def test_bad_constraints_are_400_naming_the_problem(grammar):
    srv, client = grammar.srv, grammar.client
    with pytest.raises(openai.BadRequestError, match='json_schema: .*"?nope'):
        client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=8, extra_body=NO_THINKING,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="(?i)regex: .*unclosed"):
        client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=8, extra_body={"regex": "[a-"}
        )
    with pytest.raises(openai.BadRequestError, match="guided_json and guided_regex"):
        client.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=8, extra_body={"guided_json": {}, "guided_regex": "a"}
        )
    r = httpx.post(
        f"{srv.url}/generate", json={"text": "x", "sampling_params": {"ebnf": "root ::= item"}}, timeout=30
    )
    assert r.status_code == 400 and "ebnf" in r.json()["error"]["message"]
    # the server still serves afterwards
    assert client.completions.create(model="demo", prompt="Hi", max_tokens=2).choices[0].text is not None


def test_llguidance_refuses_a_schema_after_the_reasoning_section(llguidance_srv):
    # xgrammar holds only the answer after the <think> section to a schema; llguidance's grammar would hold
    # the thinking to it too, so that is refused, naming the fix
    with pytest.raises(openai.BadRequestError, match="needs --grammar-backend xgrammar"):
        llguidance_srv.openai_client().chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=8, response_format={"type": "json_object"}
        )


def test_logit_bias_moves_the_greedy_token(srv, client):
    prompt = "The capital of France is"
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    greedy = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()["output_ids"][0]

    def first_text(bias: dict[str, float]) -> str:
        r = client.completions.create(
            model="demo", prompt=prompt, max_tokens=1, temperature=0, logit_bias=bias
        )
        return r.choices[0].text

    plain = first_text({})
    banned = first_text({str(greedy): -100})
    assert banned != plain
    body["sampling_params"]["logit_bias"] = {str(greedy): -100}
    assert httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()["output_ids"][0] != greedy
    body["sampling_params"]["logit_bias"] = {"42": 100}  # +100 forces a token, at any temperature
    body["sampling_params"]["temperature"] = 1.0
    assert httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()["output_ids"][0] == 42
    with pytest.raises(openai.BadRequestError, match="logit_bias: token id 99999999"):
        client.completions.create(model="demo", prompt="x", max_tokens=1, logit_bias={"99999999": 5})


def test_top_logprobs_match_a_float64_softmax_of_the_model(srv, client):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    ids = tok.encode("The capital of France is")
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float64)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)
    want_lp, want_ids = ref.topk(5)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": 5}  # fmt: skip
    meta = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()["meta_info"]
    top = meta["output_top_logprobs"][0]
    assert [t for _, t, _ in top] == want_ids.tolist()
    assert [lp for lp, _, _ in top] == pytest.approx(want_lp.tolist(), abs=2e-3)
    assert meta["output_token_logprobs"][0] == pytest.approx(top[0][0])
    # chat: 20 alternatives per token, most likely first, probabilities summing to at most 1
    r = client.chat.completions.create(
        model="demo", messages=MESSAGES, max_tokens=4, temperature=1, seed=2, logprobs=True, top_logprobs=20
    )
    for entry in r.choices[0].logprobs.content:
        lps = [t.logprob for t in entry.top_logprobs]
        assert len(lps) == 20 and lps == sorted(lps, reverse=True)
        assert sum(torch.tensor(lps).exp().tolist()) <= 1 + 1e-4
        assert entry.logprob >= lps[-1] - 1e-6 or entry.token not in [t.token for t in entry.top_logprobs]
    r = client.completions.create(model="demo", prompt="Hello", max_tokens=3, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert all(
        len(m) <= 3 and max(m.values()) == pytest.approx(v)
        for m, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )


def _valid_call(name: str, arguments: str) -> bool:
    args = json.loads(arguments)
    if name == "get_weather":
        return set(args) == {"city", "days"} and len(args["city"]) <= 10 and 1 <= args["days"] <= 7
    return name == "get_time" and args == {"tz": args["tz"]} and args["tz"] in ("UTC", "CET")


def test_required_and_named_tool_choice_are_enforced(client):
    r = client.chat.completions.create(
        model="demo", messages=ASK, tools=TOOLS, extra_body=NO_THINKING, tool_choice="required", parallel_tool_calls=False,
        max_tokens=100, temperature=1, seed=1, n=20,
    )  # fmt: skip
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        (call,) = ch.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert _valid_call(call.function.name, call.function.arguments), call
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model="demo",
        messages=ASK,
        tools=TOOLS,
        extra_body=NO_THINKING,
        tool_choice=named,
        max_tokens=100,
        temperature=1,
        seed=2,
    )
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert _valid_call("get_weather", call.function.arguments)
    # streamed: the call's id and name first, then its arguments in pieces the client concatenates
    stream = client.chat.completions.create(
        model="demo", messages=ASK, tools=TOOLS, extra_body=NO_THINKING, tool_choice=named, max_tokens=100, temperature=1, seed=2,
        stream=True,
    )  # fmt: skip
    pieces, names, finish = [], [], None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            assert tc.index == 0
            names += [tc.function.name] if tc.function.name else []
            pieces.append(tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and finish == "tool_calls" and len(pieces) > 2
    assert "".join(pieces) == call.function.arguments  # same seed, same call
    with pytest.raises(openai.BadRequestError, match="tool_choice: function 'nope' is not among tools"):
        client.chat.completions.create(
            model="demo", messages=ASK, tools=TOOLS, extra_body=NO_THINKING, max_tokens=4,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )  # fmt: skip


# What a Qwen3 model answers when it thinks, then calls a tool (the demo model is held to it by a regex).
QWEN_CALL = (
    r"<think>[a-z ]{1,20}</think>\n\nSure\. <tool_call>\n"
    r'\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,6}", "days": [1-7]\}\}\n</tool_call>'
)


def test_auto_tool_calls_and_reasoning_parse_whole_and_streamed(client):
    kw = dict(model="demo", messages=ASK, tools=TOOLS, max_tokens=300, temperature=1, seed=4)
    r = client.chat.completions.create(**kw, extra_body={"guided_regex": QWEN_CALL})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert re.fullmatch("[a-z ]{1,20}", msg.reasoning_content) and msg.content == "Sure."
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather" and _valid_call("get_weather", call.function.arguments)
    stream = client.chat.completions.create(**kw, extra_body={"guided_regex": QWEN_CALL}, stream=True)
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == msg.reasoning_content and content.strip() == "Sure." and finish == "tool_calls"
    assert calls == {0: {"name": "get_weather", "arguments": call.function.arguments}}
    # an answer without <think> has no reasoning (qwen3: thinking off), and no call is plain content
    r = client.chat.completions.create(**kw, extra_body={"guided_regex": "[a-z]{3} [a-z]{3}"})
    msg = r.choices[0].message
    assert msg.reasoning_content is None and re.fullmatch("[a-z]{3} [a-z]{3}", msg.content)
    assert msg.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_tokenize_and_detokenize(srv):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    r = httpx.post(f"{srv.url}/tokenize", json={"model": "demo", "prompt": "Hello world"}, timeout=30).json()
    assert r["tokens"] == tok.encode("Hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] > 0 and r["token_strs"] is None
    r = httpx.post(
        f"{srv.url}/tokenize", json={"messages": MESSAGES, "return_token_strs": True}, timeout=30
    ).json()
    want = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    assert r["tokens"] == (want if isinstance(want, list) else want["input_ids"])
    assert r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    back = httpx.post(f"{srv.url}/detokenize", json={"tokens": tok.encode("Hello world")}, timeout=30).json()
    assert back == {"prompt": "Hello world"}
    bad = httpx.post(f"{srv.url}/detokenize", json={"tokens": [10**7]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    bad = httpx.post(f"{srv.url}/tokenize", json={"prompt": "x", "foo": 1}, timeout=30)
    assert bad.status_code == 400 and "foo" in bad.json()["error"]["message"]
