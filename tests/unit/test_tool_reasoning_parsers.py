"""Tool-call and reasoning parsers: streamed in any split, they give what parsing the whole text gives."""

from __future__ import annotations

import json
import random

import pytest

from tokenspeed.runtime.entrypoints.openai.reasoning_parsers import create_reasoning_parser
from tokenspeed.runtime.entrypoints.openai.tool_parsers import create_tool_parser
from tokenspeed.runtime.entrypoints.openai.tool_parsers.tool_choice import plan_tools

HERMES = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "n": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


def _splits(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("seed", range(5))
def test_hermes_streamed_equals_whole(seed):
    whole = create_tool_parser("hermes").parse(HERMES)
    assert whole.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [
        ("get_weather", {"city": "Paris", "n": 2}),
        ("get_time", {}),
    ]
    p = create_tool_parser("hermes")
    parts = [p.feed(piece) for piece in _splits(HERMES, seed)] + [p.finish()]
    # no stray whitespace: not the space before the first call, not the newline between the calls
    assert "".join(x.content for x in parts) == whole.content
    assert [(c.name, c.arguments) for x in parts for c in x.calls] == [
        (c.name, c.arguments) for c in whole.calls
    ]


@pytest.mark.parametrize("seed", range(5))
def test_hermes_content_around_calls_is_the_same_streamed(seed):
    text = '  Hi there <tool_call>{"name": "f", "arguments": {}}</tool_call>\n\n then more  \n'
    whole = create_tool_parser("hermes").parse(text)
    assert whole.content == "  Hi there then more" and [c.name for c in whole.calls] == ["f"]
    p = create_tool_parser("hermes")
    parts = [p.feed(piece) for piece in _splits(text, seed)] + [p.finish()]
    assert "".join(x.content for x in parts) == whole.content


def test_hermes_leaves_text_without_valid_calls_alone():
    p = create_tool_parser("hermes")
    assert p.parse("a < b and <tool_call>not json</tool_call>").calls == []
    assert p.parse("plain").content == "plain"
    streamed = create_tool_parser("hermes")
    out = [streamed.feed("x <tool"), streamed.feed("s> y"), streamed.finish()]
    assert "".join(o.content for o in out) == "x <tools> y"


def test_llama3_json():
    p = create_tool_parser("llama3_json")
    parsed = p.parse('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", '{"a": 1}'), ("g", "{}")]
    assert p.parse("Hello {there}").calls == []
    s = create_tool_parser("llama3_json")
    out = [s.feed('{"name": "f", '), s.feed('"parameters": {}}'), s.finish()]
    assert [c.name for o in out for c in o.calls] == ["f"] and not "".join(o.content for o in out)


@pytest.mark.parametrize("seed", range(3))
def test_reasoning_split_streamed_equals_whole(seed):
    for name, text, want in (
        ("qwen3", "<think>\nstep one</think>\n\nThe answer", ("\nstep one", "The answer")),
        ("qwen3", "No thinking here", ("", "No thinking here")),
        ("deepseek-r1", "inside already</think>done", ("inside already", "done")),
        ("deepseek-r1", "cut off while thinking", ("cut off while thinking", "")),
    ):
        whole = create_reasoning_parser(name).parse(text)
        assert (whole.reasoning, whole.content) == want
        p = create_reasoning_parser(name)
        parts = [p.feed(piece) for piece in _splits(text, seed)] + [p.finish()]
        assert ("".join(x.reasoning for x in parts), "".join(x.content for x in parts)) == want


def test_tool_choice_plans_and_refusals():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert plan_tools(None, None, True, None) is None
    assert plan_tools(tools, "none", True, None).mode == "none"
    with pytest.raises(
        ValueError, match="tool_choice: 'auto' needs the server started with --tool-call-parser"
    ):
        plan_tools(tools, None, True, None)
    assert plan_tools(tools, "auto", True, "hermes").mode == "auto"
    required = plan_tools(tools, "required", False, None)
    assert json.loads(required.schema)["maxItems"] == 1
    assert [c.name for c in required.forced_calls('[{"name": "f", "parameters": {"x": 1}}]')] == ["f"]
    named = plan_tools(tools, {"type": "function", "function": {"name": "f"}}, True, None)
    assert named.forced_calls('{"x": 1}')[0].arguments == '{"x": 1}'
    with pytest.raises(ValueError, match="tool_choice: give tools"):
        plan_tools(None, "required", True, None)
    with pytest.raises(ValueError, match=r"tools\[0\].function.name"):
        plan_tools([{"type": "function", "function": {}}], "required", True, None)


@pytest.mark.parametrize("parser", ["qwen3", "deepseek-r1"])
def test_json_schema_is_deferred_past_the_reasoning(parser):
    xgr = pytest.importorskip("xgrammar")
    from tokenspeed.runtime.grammar.reasoning_first import defer_past_reasoning

    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    grammar = xgr.Grammar.from_ebnf(defer_past_reasoning(parser, schema, any_whitespace=False))
    opened = "<think>" if parser == "qwen3" else ""

    def accepts(text: str) -> bool:
        return xgr.testing._is_grammar_accept_string(grammar, text)

    assert accepts(opened + "step 1 < 2, </thin is not the end</think>\n\n" + '{"a": 1}')
    assert not accepts(opened + "thinking</think>\nnot json")
    assert accepts('{"a": 1}') == (parser == "qwen3")  # qwen3: thinking may be off
    with pytest.raises(ValueError, match='json_schema: Unsupported type "nope"'):
        defer_past_reasoning(parser, '{"type": "nope"}', any_whitespace=False)


def test_start_up_refuses_unknown_parsers_and_a_missing_xgrammar(monkeypatch):
    import importlib.util

    from tokenspeed.config.server_args import ServerArgs
    from tokenspeed.config.support_check import assess

    # --reasoning-parser's choices are the parsers that exist: anything else is refused naming them
    with pytest.raises(ValueError, match="--reasoning-parser 'minimax' is not supported; choose one of qwen3"):
        ServerArgs(model="demo", reasoning_parser="minimax")
    report = assess(ServerArgs(model="demo", tool_call_parser="mistral"))
    assert "hermes" in str(report.refused["tool_call_parser"])
    assert not assess(ServerArgs(model="demo", grammar_backend="xgrammar", reasoning_parser="qwen3")).refused
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real(name, *a)
    )
    report = assess(ServerArgs(model="demo", grammar_backend="xgrammar"))
    assert report.refused["grammar_backend"][2] == "pip install xgrammar"
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llguidance" else real(name, *a)
    )
    report = assess(ServerArgs(model="demo", grammar_backend="llguidance"))
    assert report.refused["grammar_backend"][2] == "pip install llguidance"
