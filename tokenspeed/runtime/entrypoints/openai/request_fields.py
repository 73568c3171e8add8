"""What every request field of /v1/chat/completions and /v1/completions does on this server, and the report
of the fields a request sent that change nothing.

- ``implemented``: read, and it changes the answer (some values are a 400 naming the field, e.g.
  ``suffix``, a ``best_of`` other than ``n``).
- ``informational``: OpenAI defines it as the client's bookkeeping (``user``, ``metadata``, ``store``);
  accepted without a word, as OpenAI accepts it.
- ``ignored``: a hint this server has nothing to apply to. Accepted (as vLLM does, never a 400), logged
  once per server at WARNING, and named in the ``x-tokenspeed-ignored-fields`` response header of every
  request that sent it.

``tests/unit/test_request_fields.py`` fails when a request model has a field without an entry here.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

logger = logging.getLogger("tokenspeed.http")

IMPLEMENTED = "implemented"
INFORMATIONAL = "informational"
IGNORED = "ignored"

IGNORED_HEADER = "x-tokenspeed-ignored-fields"


@dataclasses.dataclass(frozen=True)
class FieldSupport:
    status: str
    note: str
    endpoints: tuple[str, ...] = ("chat", "completions")


def _impl(note: str, *endpoints: str) -> FieldSupport:
    return FieldSupport(IMPLEMENTED, note, endpoints or ("chat", "completions"))


def _ignored(note: str, *endpoints: str) -> FieldSupport:
    return FieldSupport(IGNORED, note, endpoints or ("chat", "completions"))


_CHAT, _CMPL = "chat", "completions"

REQUEST_FIELDS: dict[str, FieldSupport] = {
    # OpenAI's
    "model": _impl("a served name or the model path; another is a 404"),
    "messages": _impl("text content parts; others are a 400", _CHAT),
    "prompt": _impl("text, token ids, or lists of either", _CMPL),
    "n": _impl("1..128 sequences, distinct seeds"),
    "temperature": _impl("sampling"),
    "top_p": _impl("sampling"),
    "seed": _impl("per-request generator; sequence i of n gets seed + i"),
    "stop": _impl("up to 16 strings, matched across tokens"),
    "max_tokens": _impl("past the context is a 400 (context_length_exceeded)"),
    "max_completion_tokens": _impl("OpenAI's newer max_tokens", _CHAT),
    "frequency_penalty": _impl("sampling"),
    "presence_penalty": _impl("sampling"),
    "logit_bias": _impl("token id -> bias, clamped to +-100"),
    "logprobs": _impl("chat: bool; completions: 0..20 alternatives (--disable-output-logprobs: a 400)"),
    "top_logprobs": _impl("0..20 alternatives per token", _CHAT),
    "stream": _impl("server-sent events"),
    "stream_options": _impl("include_usage; continuous_usage_stats is a 400 (usage comes once)"),
    "stream_options.include_obfuscation": _ignored("chunks are sent without OpenAI's random padding"),
    "tools": _impl("function tools, shown through the chat template", _CHAT),
    "tool_choice": _impl("none / auto (--tool-call-parser) / required / a named function", _CHAT),
    "parallel_tool_calls": _impl("false: at most one call", _CHAT),
    "functions": _impl("legacy function calling: served as tools, answered as message.function_call", _CHAT),
    "function_call": _impl("legacy: none / auto / {name} as tool_choice", _CHAT),
    "response_format": _impl("json_object / json_schema through the grammar backend", _CHAT),
    "echo": _impl("completions: the prompt before the text; chat: the last assistant message before it"),
    "suffix": _impl("an empty suffix only; insertion is a 400", _CMPL),
    "best_of": _impl("equal to n only; otherwise a 400", _CMPL),
    "user": FieldSupport(INFORMATIONAL, "the client's end-user id"),
    "metadata": FieldSupport(INFORMATIONAL, "the client's tags"),
    "store": FieldSupport(INFORMATIONAL, "nothing is stored"),
    "safety_identifier": _ignored("no per-user safety policy here"),
    "prompt_cache_key": _ignored("prefix caching is automatic (the radix cache), no key routes it"),
    "service_tier": _ignored("one tier: every request is served alike"),
    "reasoning_effort": _ignored("the reasoning parsers have no thinking budget to set", _CHAT),
    "prediction": _ignored("predicted outputs are not used to speculate", _CHAT),
    "modalities": _ignored("text is the only output; ['text'] is not reported", _CHAT),
    "verbosity": _ignored("no verbosity control", _CHAT),
    # vLLM's and SGLang's extras
    "top_k": _impl("sampling"),
    "min_p": _impl("sampling"),
    "repetition_penalty": _impl("sampling"),
    "stop_token_ids": _impl("ids that end the sequence"),
    "ignore_eos": _impl("generate past EOS"),
    "skip_special_tokens": _impl("detokenization"),
    "min_tokens": _impl("EOS and stop ids masked until then"),
    "include_stop_str_in_output": _impl("the matched stop string ends the text"),
    "rid": _impl("the request id (SGLang's)"),
    "prompt_logprobs": _impl("vLLM's per-prompt-token logprobs, 0..20; not with stream"),
    "guided_json": _impl("grammar backend"),
    "guided_regex": _impl("grammar backend"),
    "guided_choice": _impl("grammar backend"),
    "guided_grammar": _impl("grammar backend (EBNF)"),
    "regex": _impl("grammar backend (SGLang's spelling)"),
    "ebnf": _impl("grammar backend (SGLang's spelling)"),
    "structured_outputs": _impl(
        "vLLM's json / regex / choice / grammar / json_object; structural_tag is a 400"
    ),
    "structured_outputs.disable_fallback": _ignored("one backend per server, chosen at start-up"),
    "structured_outputs.disable_any_whitespace": _ignored("a server setting here (--disable-any-whitespace)"),
    "structured_outputs.disable_additional_properties": _ignored("schemas are compiled as sent"),
    "structured_outputs.whitespace_pattern": _ignored("a server setting here (--disable-any-whitespace)"),
    "add_generation_prompt": _impl("chat template argument", _CHAT),
    "continue_final_message": _impl("the last assistant message is continued, not closed", _CHAT),
    "chat_template_kwargs": _impl("passed to the chat template (enable_thinking, ...)", _CHAT),
}


def ignored_fields(req: Any) -> tuple[str, ...]:
    """The fields `req` sent that change nothing on this server, in the table's order."""
    sent: set[str] = set(req.model_fields_set)
    for sub in ("stream_options", "structured_outputs"):
        value = getattr(req, sub, None)
        if value is not None:
            sent |= {f"{sub}.{name}" for name in value.model_fields_set}
    if getattr(req, "modalities", None) is not None and set(req.modalities) <= {"text"}:
        sent.discard("modalities")  # asks for text, which is what it gets
    return tuple(
        name
        for name, support in REQUEST_FIELDS.items()
        if support.status == IGNORED and name in sent and _value(req, name) is not None
    )


def _value(req: Any, name: str) -> Any:
    obj: Any = req
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj


def report_ignored(reported: set[str], req: Any, endpoint: str) -> tuple[str, ...]:
    """The ignored fields of `req`; each is logged the first time this server sees it (`reported` is the
    server's own set, kept in ServerState)."""
    names = ignored_fields(req)
    new = [n for n in names if n not in reported]
    if new:
        reported.update(new)
        logger.warning(
            "%s: request field(s) %s accepted with no effect on this server (%s); reported once, and in "
            "the %s response header",
            endpoint,
            ", ".join(new),
            "; ".join(f"{n}: {REQUEST_FIELDS[n].note}" for n in new),
            IGNORED_HEADER,
        )
    return names
