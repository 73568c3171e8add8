"""`--tool-call-parser hermes` (also `qwen25`): Hermes/Qwen tool calls, each a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` (what Qwen2.5/Qwen3 chat
templates teach the model); text outside the tags is content.

Whitespace around calls is not content unless text follows: templates put a space or a newline before
`<tool_call>` and a newline between calls, and a client would otherwise show content of "Sure. " or "\\n"
(text after the calls is joined to the text before them by the whitespace before the first call). The
whole output is parsed by streaming it through the same parser, so `content` is the same whether the
client streams or not.
"""

from __future__ import annotations

import json

from tokenspeed.runtime.entrypoints.openai.tool_parsers.base import Parsed, ToolCall, ToolParser, make_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"


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
        self._ws = ""  # trailing whitespace of the content: shown only once more text follows
        self._after_call = False  # whitespace right after a call is dropped
        self._seen_call = False

    def parse(self, text: str) -> Parsed:
        if OPEN not in text:
            return Parsed(text, [])
        p = HermesParser()
        a, b = p.feed(text), p.finish()
        return Parsed(a.content + b.content, a.calls + b.calls)

    def _content(self, text: str) -> str:
        """Content released from the buffer, minus the whitespace a call may still claim."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body) :]
        return body

    def _call(self, call: ToolCall) -> None:
        self._after_call, self._seen_call = True, True

    def feed(self, delta: str) -> Parsed:
        self._buf += delta
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if not self._in_call:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _held_prefix(self._buf, OPEN)
                    content.append(self._content(self._buf[: len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                content.append(self._content(self._buf[:at]))
                self._buf = self._buf[at + len(OPEN) :]
                self._in_call = True
            end = self._buf.find(CLOSE)
            if end < 0:
                break
            body, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
            self._in_call = False
            call = _decode(body.strip())
            if call is not None:
                self._call(call)
                calls.append(call)
            else:
                content.append(self._content(OPEN + body + CLOSE))  # not a valid call: its text is content
        return Parsed("".join(content), calls)

    def finish(self) -> Parsed:
        rest, self._buf = self._buf, ""
        content, calls = "", []
        if self._in_call:
            self._in_call = False
            call = _decode(rest.strip())  # an unclosed last call (the stop token ended it)
            if call is not None:
                self._call(call)
                calls.append(call)
            else:
                content = self._content(OPEN + rest)
        else:
            content = self._content(rest)
        # trailing whitespace is content only in an answer without calls (then the text is returned whole)
        if not self._seen_call:
            content += self._ws
        self._ws = ""
        return Parsed(content, calls)
