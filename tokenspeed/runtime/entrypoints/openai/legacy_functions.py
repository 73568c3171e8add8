"""OpenAI's legacy function calling (`functions`, `function_call`), served by the tools machinery.

A request with `functions` is run as one with the same functions as tools, `function_call` as its
`tool_choice`, and at most one call (the legacy API has no parallel calls). The answer takes the legacy
shape: `message.function_call` (streamed as `delta.function_call`) and finish_reason "function_call".
"""

from __future__ import annotations

from typing import Any


def as_tools(
    functions: list[dict[str, Any]] | None,
    function_call: Any,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
) -> tuple[list[dict[str, Any]] | None, Any]:
    """(tools, tool_choice) of the request; ValueError naming the field when the two spellings clash."""
    if functions is None:
        if function_call is not None:
            raise ValueError("function_call: give functions to choose from, or use tools and tool_choice")
        return tools, tool_choice
    if tools is not None or tool_choice is not None:
        raise ValueError(
            "functions: give tools and tool_choice or the legacy functions and function_call, not both"
        )
    if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
        raise ValueError("functions: give a list of {'name': ..., 'parameters': ...} objects")
    choice: Any
    if function_call is None or function_call in ("none", "auto"):
        choice = function_call
    elif isinstance(function_call, dict) and isinstance(function_call.get("name"), str):
        choice = {"type": "function", "function": {"name": function_call["name"]}}
    else:
        raise ValueError("function_call: give 'none', 'auto' or {'name': ...}")
    return [{"type": "function", "function": f} for f in functions], choice


def message(msg: dict[str, Any]) -> dict[str, Any]:
    """A chat message with tool calls, in the legacy shape (the first call only)."""
    calls = msg.pop("tool_calls", None)
    if calls:
        msg["function_call"] = calls[0]["function"]
    return msg


def delta(d: dict[str, Any]) -> dict[str, Any] | None:
    """A stream delta in the legacy shape; None for a delta of a call after the first."""
    calls = d.pop("tool_calls", None)
    if not calls:
        return d
    call = calls[0]
    if call.get("index", 0) != 0:
        return None
    d["function_call"] = {k: v for k, v in call["function"].items() if k == "arguments" or v is not None}
    return d


def finish_reason(reason: str | None) -> str | None:
    return "function_call" if reason == "tool_calls" else reason
