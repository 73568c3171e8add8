"""The request-field table covers every field the OpenAI routes accept, and `tokenspeed serve --help`
says what the client-facing flags do."""

from __future__ import annotations

import pytest

from tokenspeed.config.cli import build_parser
from tokenspeed.runtime.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    StructuredOutputs,
)
from tokenspeed.runtime.entrypoints.openai.request_fields import IGNORED, REQUEST_FIELDS, ignored_fields


@pytest.mark.parametrize(
    ("model", "endpoint"), [(ChatCompletionRequest, "chat"), (CompletionRequest, "completions")]
)
def test_every_request_field_has_a_status(model, endpoint):
    missing = [n for n in model.model_fields if n not in REQUEST_FIELDS]
    assert not missing, f"add {missing} to request_fields.REQUEST_FIELDS"
    wrong = [n for n in model.model_fields if endpoint not in REQUEST_FIELDS[n].endpoints]
    assert not wrong, f"{wrong} are accepted by {endpoint} but the table says otherwise"
    # a nested key is either one its parent's entry implements or has its own entry
    implemented = {"include_usage", "continuous_usage_stats", "json_schema", "regex", "choice", "grammar",
                   "json_object"}  # fmt: skip
    for sub, sub_model in (("stream_options", StreamOptions), ("structured_outputs", StructuredOutputs)):
        for name in set(sub_model.model_fields) - implemented:
            assert REQUEST_FIELDS[f"{sub}.{name}"].status == IGNORED


def test_ignored_fields_are_those_sent_with_a_value():
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}],
        verbosity="low",
        modalities=["text"],
        service_tier=None,
        stream_options={"include_obfuscation": True},
    )
    assert ignored_fields(req) == ("stream_options.include_obfuscation", "verbosity")
    assert all(REQUEST_FIELDS[n].status == IGNORED for n in ignored_fields(req))


def test_help_says_what_the_client_flags_do():
    parser = build_parser()
    actions = {a.dest: a for a in parser._actions if a.help}
    logprobs = [a for a in parser._actions if "--disable-output-logprobs" in a.option_strings][0]
    assert "400" in logprobs.help and "empty" not in actions["enable_output_logprobs"].help
    assert parser.get_default("enable_output_logprobs") is True
    assert parser.get_default("grammar_backend") == "xgrammar"
    assert actions["reasoning_parser"].choices == ["qwen3", "deepseek-r1", "deepseek_r1"]
    assert "minimax" not in actions["reasoning_parser"].help
