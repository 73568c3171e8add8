"""What a tool-call parser turns model text into, and the streaming interface every parser offers.

A parser splits text into plain content and tool calls. Streaming, it is fed the text deltas in order and
returns what can be shown now: content that cannot start a tool call, and complete tool calls (text that
might still become one is held back until it is decided).
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def make_call(obj: Any, args_key: str = "arguments") -> ToolCall | None:
    """A ToolCall from a decoded {"name": ..., "arguments"/"parameters": ...} object, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("parameters", obj.get("arguments", {})))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


@dataclass
class Parsed:
    content: str
    calls: list[ToolCall]


class ToolParser(ABC):
    @abstractmethod
    def parse(self, text: str) -> Parsed:
        """The whole output: its content and its tool calls."""

    @abstractmethod
    def feed(self, delta: str) -> Parsed:
        """Streaming: what the new text makes showable."""

    @abstractmethod
    def finish(self) -> Parsed:
        """Streaming: the rest, at the end of the output."""
