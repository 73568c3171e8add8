"""`--tool-call-parser llama3_json`: Llama 3.x JSON tool calls, the whole answer being
`{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`, several separated by `;`).
An answer that is not such JSON is content. Streaming holds an answer that starts like one to its end."""

from __future__ import annotations

import json

from tokenspeed.runtime.entrypoints.openai.tool_parsers.base import Parsed, ToolCall, ToolParser, make_call

_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    def __init__(self) -> None:
        self._buf = ""
        self._decided: bool | None = None  # None until the first non-space text says call or content

    def parse(self, text: str) -> Parsed:
        body = text.strip()
        if body.startswith(_TAG):
            body = body[len(_TAG) :].strip()
        if not body.startswith("{"):
            return Parsed(text, [])
        calls: list[ToolCall] = []
        decoder = json.JSONDecoder()
        pos = 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return Parsed(text, [])
            call = make_call(obj, "parameters")
            if call is None:
                return Parsed(text, [])
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \n\t;":
                pos += 1
        return Parsed("", calls)

    def feed(self, delta: str) -> Parsed:
        self._buf += delta
        if self._decided is None:
            head = self._buf.lstrip()
            if not head:
                return Parsed("", [])
            if head.startswith("{") or head.startswith(_TAG):
                self._decided = True
            elif _TAG.startswith(head):
                return Parsed("", [])
            else:
                self._decided = False
        if self._decided:
            return Parsed("", [])
        out, self._buf = self._buf, ""
        return Parsed(out, [])

    def finish(self) -> Parsed:
        rest, self._buf = self._buf, ""
        return self.parse(rest) if self._decided or self._decided is None else Parsed(rest, [])
