"""Tool-call parsers, chosen by `--tool-call-parser` (config/support.py lists the same names)."""

from __future__ import annotations

from tokenspeed.runtime.entrypoints.openai.tool_parsers.base import Parsed, ToolCall, ToolParser
from tokenspeed.runtime.entrypoints.openai.tool_parsers.hermes import HermesParser
from tokenspeed.runtime.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen25": HermesParser,
    "llama3_json": Llama3JsonParser,
}


def create_tool_parser(name: str) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ValueError(
            f"--tool-call-parser {name!r} is not available; choose one of {sorted(TOOL_PARSERS)}"
        )
    return TOOL_PARSERS[name]()


__all__ = ["TOOL_PARSERS", "Parsed", "ToolCall", "ToolParser", "create_tool_parser"]
