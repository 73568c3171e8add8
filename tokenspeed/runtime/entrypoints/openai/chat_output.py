"""One chat choice's text as the OpenAI API shows it: `reasoning_content` split off by the reasoning
parser, tool calls read by the tool-call parser (tool_choice auto) or from the constrained answer
(required / named), and the rest as `content`; whole (`message`) or as streaming deltas."""

from __future__ import annotations

from typing import Any

from tokenspeed.runtime.entrypoints.openai.reasoning_parsers import Split, create_reasoning_parser
from tokenspeed.runtime.entrypoints.openai.tool_parsers import ToolCall, create_tool_parser
from tokenspeed.runtime.entrypoints.openai.tool_parsers.tool_choice import ToolPlan


def _call_deltas(index: int, call: ToolCall) -> list[dict[str, Any]]:
    """A call as the OpenAI stream sends it: id and name first, then the arguments."""
    head = {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return [
        {"tool_calls": [head]},
        {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]},
    ]


class ChoiceOutput:
    def __init__(
        self, reasoning_parser: str | None, plan: ToolPlan | None, tool_call_parser: str | None
    ) -> None:
        self._reasoning = create_reasoning_parser(reasoning_parser) if reasoning_parser else None
        self._plan = plan
        auto = plan is not None and plan.mode == "auto" and tool_call_parser is not None
        self._parser = create_tool_parser(tool_call_parser) if auto else None
        self._forced = plan is not None and plan.mode in ("required", "named")
        self._forced_text: list[str] = []
        self._named_call: ToolCall | None = None
        self.num_calls = 0

    # ---- whole ----------------------------------------------------------------------------------
    def message(self, text: str) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant"}
        content: str | None = text
        if self._reasoning is not None:
            split = self._reasoning.parse(text)
            msg["reasoning_content"] = split.reasoning or None
            content = split.content
        calls: list[ToolCall] = []
        if self._forced:
            calls, content = self._plan.forced_calls(content or ""), None
        elif self._parser is not None:
            parsed = self._parser.parse(content or "")
            calls, content = parsed.calls, parsed.content if (parsed.content or not parsed.calls) else None
        msg["content"] = content
        if calls:
            msg["tool_calls"] = [c.to_dict() for c in calls]
        self.num_calls = len(calls)
        return msg

    # ---- streaming ------------------------------------------------------------------------------
    def delta(self, text: str) -> list[dict[str, Any]]:
        split = self._reasoning.feed(text) if self._reasoning is not None else Split("", text)
        return self._deltas(split, final=False)

    def end(self) -> list[dict[str, Any]]:
        split = self._reasoning.finish() if self._reasoning is not None else Split("", "")
        return self._deltas(split, final=True)

    def _deltas(self, split: Split, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if split.reasoning:
            out.append({"reasoning_content": split.reasoning})
        content = split.content
        if self._forced:
            out += self._forced_deltas(content, final)
        elif self._parser is not None:
            parsed = self._parser.feed(content) if content else None
            for p in [parsed, self._parser.finish() if final else None]:
                if p is None:
                    continue
                if p.content:
                    out.append({"content": p.content})
                for call in p.calls:
                    out += _call_deltas(self.num_calls, call)
                    self.num_calls += 1
        elif content:
            out.append({"content": content})
        return out

    def _forced_deltas(self, content: str, final: bool) -> list[dict[str, Any]]:
        if self._plan.mode == "named":
            # the answer is the arguments: stream them as they come, after the call's id and name
            out = []
            if self._named_call is None and (content or final):
                self._named_call = ToolCall(self._plan.name or "", "")
                out.append(_call_deltas(0, self._named_call)[0])
                self.num_calls = 1
            if content:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": content}}]})
            return out
        self._forced_text.append(content)
        if not final:
            return []  # an array of calls: sent whole once it is complete
        out = []
        for call in self._plan.forced_calls("".join(self._forced_text)):
            out += _call_deltas(self.num_calls, call)
            self.num_calls += 1
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.num_calls else reason
