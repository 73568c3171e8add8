"""Reasoning parsers, chosen by `--reasoning-parser` (config/support.py lists the same names): the model's
`<think>...</think>` section goes to `reasoning_content`, the rest stays `content`.

- `qwen3`: the output opens its reasoning with `<think>`; an output without it has no reasoning (thinking
  turned off in the template).
- `deepseek-r1` (`deepseek_r1`): the chat template opens `<think>` in the prompt, so the output starts
  inside the reasoning; everything up to `</think>` is reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass
class Split:
    reasoning: str
    content: str


def _held(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkParser:
    def __init__(self, starts_in_reasoning: bool) -> None:
        self._starts_in = starts_in_reasoning
        self._buf = ""
        self._state = "start"  # start -> reasoning -> closed -> content

    def parse(self, text: str) -> Split:
        p = ThinkParser(self._starts_in)
        a, b = p.feed(text), p.finish()
        return Split(a.reasoning + b.reasoning, a.content + b.content)

    def feed(self, delta: str) -> Split:
        self._buf += delta
        reasoning, content = [], []
        while True:
            if self._state == "start":
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._buf, self._state = head[len(OPEN) :], "reasoning"
                elif head and OPEN.startswith(head):
                    break  # might still become <think>
                elif head or self._starts_in:
                    self._state = "reasoning" if self._starts_in else "content"
                else:
                    break
            elif self._state == "reasoning":
                at = self._buf.find(CLOSE)
                if at < 0:
                    keep = _held(self._buf, CLOSE)
                    reasoning.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                reasoning.append(self._buf[:at])
                self._buf, self._state = self._buf[at + len(CLOSE) :], "closed"
            elif self._state == "closed":
                # templates put blank lines after </think>; they belong to neither part
                self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    break
                self._state = "content"
            else:
                content.append(self._buf)
                self._buf = ""
                break
        return Split("".join(reasoning), "".join(content))

    def finish(self) -> Split:
        rest, self._buf = self._buf, ""
        if self._state == "reasoning":
            return Split(rest, "")
        return Split("", rest)


REASONING_PARSERS: dict[str, bool] = {"qwen3": False, "deepseek-r1": True, "deepseek_r1": True}


def create_reasoning_parser(name: str) -> ThinkParser:
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"--reasoning-parser {name!r} is not available; choose one of {sorted(REASONING_PARSERS)}"
        )
    return ThinkParser(starts_in_reasoning=REASONING_PARSERS[name])
