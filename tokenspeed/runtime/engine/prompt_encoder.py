"""Turning request text into prompt token ids without holding up the event loop.

Tokenizing a long prompt (or rendering a chat template) takes time in proportion to its length; on the
HTTP server's event loop it would stall every other client's stream and even `/health`. So it runs on a
worker thread (the fast tokenizers release the GIL while they work), after two checks that cost next to
nothing on the loop:

- text longer than `max_model_len` tokens can spell (each token decodes to at most `max_token_chars`
  characters, the longest entry of the vocabulary) is refused at once, without tokenizing it;
- text that is not valid Unicode (a lone surrogate, which JSON lets a client write as `\\ud800`) is
  refused naming the field, rather than with whatever the tokenizer's internals say about it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenspeed.runtime.engine.tokenizer import apply_chat_template

# Shorter text is tokenized inline: a thread hop would cost more than it saves.
_INLINE_CHARS = 4096


class InvalidText(ValueError):
    """Text the server cannot take (the HTTP layer answers 400 naming `param`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class TextTooLong(InvalidText):
    """More characters than the context can hold as tokens (400, context_length_exceeded)."""


def longest_token_chars(tokenizer: Any) -> int | None:
    """Characters of the longest vocabulary entry (added tokens included): no token decodes to more.

    Byte-level BPE spells each byte as one character and SentencePiece a space as one, so the entries'
    lengths bound what their tokens decode to. None when the tokenizer cannot list its vocabulary.
    """
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return None
    return max((len(t) for t in vocab), default=None) or None


def check_unicode(value: Any, param: str) -> None:
    """InvalidText naming the field of the first string in `value` that is not valid Unicode."""
    for path, text in _strings(value, param):
        if text.isascii():
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidText(
                f"{path}: the text holds a lone surrogate ({text[exc.start]!r} at character {exc.start}), "
                "which is not valid Unicode: a JSON escape such as \\ud83d must be followed by its low half "
                "(\\ude00); send the text as UTF-8",
                param=path,
            ) from None


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                yield from _strings(k, f"{path}.{k}" if path else k)
            yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


class PromptEncoder:
    """Tokenizes prompts and renders chat templates on one worker thread.

    One thread, not several: a fast tokenizer may not be used from two threads while one of them changes
    its truncation settings, and one prompt at a time keeps the server's CPU for decoding.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_token_chars = longest_token_chars(tokenizer) if tokenizer is not None else None
        self.max_model_len: int | None = None  # set once the schedulers report it
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def max_chars(self) -> int | None:
        """The most characters a prompt that fits the context can have."""
        if self.max_token_chars is None or self.max_model_len is None:
            return None
        return self.max_token_chars * self.max_model_len

    def check_length(self, chars: int, param: str) -> None:
        limit = self.max_chars
        if limit is not None and chars > limit:
            raise TextTooLong(
                f"{param}: {chars} characters cannot fit the context of {self.max_model_len} tokens (no "
                f"token of this model spells more than {self.max_token_chars} characters); shorten it",
                param=param,
            )

    async def encode(self, text: str, param: str = "prompt") -> list[int]:
        self.check_length(len(text), param)
        check_unicode(text, param)
        return await self._run(len(text), self.tokenizer.encode, text)

    async def encode_chat(self, messages: list[dict[str, Any]], **template: Any) -> list[int]:
        """Token ids of `messages` through the chat template; `template` as `apply_chat_template` takes."""
        check_unicode(messages, "messages")
        check_unicode(template, "chat_template_kwargs")
        chars = sum(len(t) for _, t in _strings([messages, template.get("tools")], ""))
        self.check_length(chars, "messages")
        return await self._run(chars, _render, self.tokenizer, messages, template)

    async def _run(self, chars: int, fn: Any, *args: Any) -> list[int]:
        if chars <= _INLINE_CHARS:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


def _render(tokenizer: Any, messages: list[dict[str, Any]], template: dict[str, Any]) -> list[int]:
    from jinja2 import TemplateError

    try:
        return apply_chat_template(tokenizer, messages, **template)
    except (TemplateError, TypeError, KeyError, IndexError, AttributeError) as exc:
        # The template's own checks (roles that must alternate, ...) and its look-ups into messages and
        # tools fail on what the client sent.
        raise InvalidText(
            f"messages: the model's chat template cannot render them: {type(exc).__name__}: {exc}", "messages"
        ) from exc
