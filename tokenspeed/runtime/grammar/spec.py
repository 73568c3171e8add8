"""The output constraint of an OpenAI-style request, as (field, kind, text): the field that asked for it
(named in errors), and the SamplingParams field (`json_schema`, `regex` or `ebnf`) that carries it.

vLLM's extra_body spellings (`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and its newer
`structured_outputs` object, whose keys arrive here as `structured_outputs.json` ...), SGLang's (`regex`,
`ebnf`) and OpenAI's `response_format` are accepted; more than one is refused by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# Any JSON object: what response_format {"type": "json_object"} asks for.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


@dataclass(frozen=True)
class OutputConstraint:
    field: str  # the request field that asked for it
    kind: str  # json_schema | regex | ebnf (a SamplingParams field)
    text: str


def _schema_text(field: str, schema: Any) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{field}: not valid JSON ({exc})") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{field}: a JSON schema must be an object, got {type(schema).__name__}")
    return json.dumps(schema)


def from_response_format(response_format: dict[str, Any] | None) -> OutputConstraint | None:
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return OutputConstraint("response_format", "json_schema", JSON_OBJECT_SCHEMA)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise ValueError("response_format.json_schema: give an object with a 'schema'")
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            # OpenAI allows a schema-less json_schema: any JSON object then.
            return OutputConstraint("response_format", "json_schema", JSON_OBJECT_SCHEMA)
        return OutputConstraint(
            "response_format", "json_schema", _schema_text("response_format.json_schema.schema", schema)
        )
    raise ValueError(f"response_format.type {kind!r} is not supported; use text, json_object or json_schema")


def choice_regex(choices: list[Any], field: str = "guided_choice") -> str:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"{field}: give a non-empty list of strings")
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def from_request(response_format: dict[str, Any] | None, extra: dict[str, Any]) -> OutputConstraint | None:
    """The one constraint among response_format and the extra fields (`guided_json`, ...), or None."""
    found: list[OutputConstraint] = []
    rf = from_response_format(response_format)
    if rf is not None:
        found.append(rf)
    for name in ("guided_json", "structured_outputs.json"):
        if extra.get(name) is not None:
            found.append(OutputConstraint(name, "json_schema", _schema_text(name, extra[name])))
    if extra.get("structured_outputs.json_object"):
        found.append(OutputConstraint("structured_outputs.json_object", "json_schema", JSON_OBJECT_SCHEMA))
    for name in ("guided_regex", "regex", "structured_outputs.regex"):
        if extra.get(name) is not None:
            found.append(OutputConstraint(name, "regex", _text(name, extra[name])))
    for name in ("guided_grammar", "ebnf", "structured_outputs.grammar"):
        if extra.get(name) is not None:
            found.append(OutputConstraint(name, "ebnf", _text(name, extra[name])))
    for name in ("guided_choice", "structured_outputs.choice"):
        if extra.get(name) is not None:
            found.append(OutputConstraint(name, "regex", choice_regex(extra[name], name)))
    if len(found) > 1:
        names = " and ".join(c.field for c in found)
        raise ValueError(f"{names}: give at most one output constraint per request")
    return found[0] if found else None


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value
