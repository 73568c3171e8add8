"""`tools` and `tool_choice` of a chat request: which mode applies, and the output constraint that
enforces `required` and a named function (a JSON schema compiled by the grammar backend, as vLLM does).

- `none`: tools are shown to the model (through the chat template), its answer is plain content.
- `auto`: the model decides; `--tool-call-parser` reads calls from its text.
- `required`: the answer is a JSON array of one or more `{"name", "parameters"}` objects (at most one
  without `parallel_tool_calls`).
- `{"type": "function", "function": {"name": N}}`: the answer is the JSON arguments of N.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenspeed.runtime.entrypoints.openai.tool_parsers.base import ToolCall, make_call


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # none | auto | required | named
    name: str | None = None  # the named function
    schema: str | None = None  # json_schema text enforcing required / named

    def forced_calls(self, text: str) -> list[ToolCall]:
        """The calls a required / named answer holds (the grammar made it valid JSON)."""
        if self.mode == "named":
            return [ToolCall(self.name or "", text.strip())]
        calls = [make_call(it, "parameters") for it in _complete_items(text)]
        return [c for c in calls if c is not None]


def _complete_items(text: str) -> list[Any]:
    """The complete items of a JSON array, also of one that max_tokens cut off: a required tool choice
    returns the calls it finished, as a named one returns its arguments as far as they came."""
    body = text.strip()
    if not body.startswith("["):
        return []
    decoder = json.JSONDecoder()
    items: list[Any] = []
    pos = 1
    while True:
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(body) or body[pos] == "]":
            return items
        try:
            item, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return items  # the item max_tokens cut off
        items.append(item)


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
        ):
            raise ValueError(
                f"tools[{i}]: give {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name: give the function's name")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters: give a JSON schema object")
        _check_schema(params, f"tools[{i}].function.parameters")
        out[name] = params or {"type": "object"}
    return out


def _check_schema(schema: dict[str, Any], param: str) -> None:
    """ValueError naming `param` when `schema` is not a JSON schema (`{"type": "nope"}`): the template
    would show it to the model as is, and a grammar built from it would fail later or hold nothing."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise ValueError(f"{param}{where}: not a valid JSON schema: {exc.message}") from None


def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    parser: str | None,
) -> ToolPlan | None:
    """None when the request has nothing to do with tools; ValueError naming the field otherwise."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ValueError("tool_choice: give tools to choose from, or leave tool_choice out")
        return None
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan("none")
    if choice == "auto":
        if parser is None:
            raise ValueError(
                "tool_choice: 'auto' needs the server started with --tool-call-parser (hermes for the "
                "<tool_call> format of Qwen templates); or send tool_choice 'required', a named function, "
                "or 'none'"
            )
        return ToolPlan("auto")
    if choice == "required":
        variants = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name, params in functions.items()
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
        if not parallel_tool_calls:
            schema["maxItems"] = 1
        return ToolPlan("required", schema=json.dumps(schema))
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in functions:
            raise ValueError(f"tool_choice: function {name!r} is not among tools ({', '.join(functions)})")
        return ToolPlan("named", name=name, schema=json.dumps(functions[name]))
    raise ValueError(
        f"tool_choice: {tool_choice!r} is not one of 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}"
    )
