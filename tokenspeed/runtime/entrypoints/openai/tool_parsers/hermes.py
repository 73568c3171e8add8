"""`--tool-call-parser hermes` (also `qwen25`): Hermes/Qwen tool calls, each a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` (what Qwen2.5/Qwen3 chat
templates teach the model); text outside the tags is content."""

from __future__ import annotations

import json
import re

from tokenspeed.runtime.entrypoints.openai.tool_parsers.base import Parsed, ToolCall, ToolParser, make_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


def _decode(body: str) -> ToolCall | None:
    try:
        return make_call(json.loads(body))
    except json.JSONDecodeError:
        return None


def _held_prefix(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesParser(ToolParser):
    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False

    def parse(self, text: str) -> Parsed:
        if OPEN not in text:
            return Parsed(text, [])
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for m in _BLOCK.finditer(text):
            call = _decode(m.group(1))
            if call is None:
                continue  # not a valid call: its text stays content
            kept.append(text[pos : m.start()])
            calls.append(call)
            pos = m.end()
        kept.append(text[pos:])
        return Parsed("".join(kept).strip() if calls else text, calls)

    def feed(self, delta: str) -> Parsed:
        self._buf += delta
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if not self._in_call:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _held_prefix(self._buf, OPEN)
                    content.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                content.append(self._buf[:at])
                self._buf = self._buf[at + len(OPEN) :]
                self._in_call = True
            end = self._buf.find(CLOSE)
            if end < 0:
                break
            body, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
            self._in_call = False
            call = _decode(body.strip())
            if call is not None:
                calls.append(call)
            else:
                content.append(OPEN + body + CLOSE)
        return Parsed("".join(content), calls)

    def finish(self) -> Parsed:
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            call = _decode(rest.strip())  # an unclosed last call (the stop token ended it)
            return Parsed("", [call]) if call is not None else Parsed(OPEN + rest, [])
        return Parsed(rest, [])
