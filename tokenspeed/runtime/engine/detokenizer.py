"""Incremental detokenization: token ids in, text deltas out, with stop strings.

Decoding a growing id list one token at a time is wrong in two ways this class handles:
- a character may span several tokens (byte-level BPE splits multi-byte UTF-8), so a token may decode to a
  partial character (U+FFFD) that must be held until the rest arrives;
- tokenizers that drop a leading space at the start of a decode (SentencePiece "▁") need context, so the
  delta is computed as decode(window + new) minus decode(window), with a few prompt tokens as the first window.

Stop strings may form across token boundaries: text that could still be the start of a stop string is held
back; once a stop string appears, the text before it is released and the stop string itself never is
(unless the request asks for it, vLLM's `include_stop_str_in_output`).
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"
# How many prompt tokens to keep as decode context for the first output token.
_PROMPT_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """Turns the output ids of one sequence into text deltas.

    `append(new_ids)` returns `(delta, stopped)`: the text newly safe to show, and whether a stop string was
    matched (then the caller finishes the request; later appends return `("", True)`).
    `append(new_ids, final=True)` (or `flush()`) releases whatever was held back, once the sequence ended
    for another reason (EOS, length, abort).
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int], sampling_params: Any) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = bool(getattr(sampling_params, "skip_special_tokens", True))
        stop = getattr(sampling_params, "stop", None) or []
        if isinstance(stop, str):
            stop = [stop]
        self.stop: list[str] = [s for s in stop if s]
        self._max_stop_len = max((len(s) for s in self.stop), default=0)
        self._keep_stop = bool(getattr(sampling_params, "include_stop_str_in_output", False))

        self.output_ids: list[int] = []
        self.matched_stop: str | None = None
        context = self._prompt_context(list(prompt_ids)) if tokenizer is not None else []
        self._ids: list[int] = context  # context window + output ids, the ids decoding works on
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = len(context)  # ids before this are already in _text
        self._text = ""  # decoded output text (cut at the stop string once one matched)
        self._emitted = 0  # characters of _text already returned

    @property
    def text(self) -> str:
        """The text returned so far."""
        return self._text[: self._emitted]

    @property
    def stopped(self) -> bool:
        return self.matched_stop is not None

    def append(self, new_ids: list[int], final: bool = False) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self.output_ids.extend(new_ids)
        if self.tokenizer is None:
            return "", False
        self._ids.extend(new_ids)
        self._decode_pending(final)
        return self._release(final)

    def flush(self) -> str:
        return self.append([], final=True)[0]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def _prompt_context(self, prompt_ids: list[int]) -> list[int]:
        # A context that itself decodes to a partial character would misalign the first delta: shrink it
        # until it decodes cleanly.
        for k in range(min(_PROMPT_CONTEXT_TOKENS, len(prompt_ids)), 0, -1):
            ctx = prompt_ids[-k:]
            if _REPLACEMENT not in self._decode(ctx):
                return ctx
        return []

    def _decode_pending(self, final: bool) -> None:
        if self._read_offset >= len(self._ids):
            return
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if full_text.endswith(_REPLACEMENT) and not final:
            return  # a character is still incomplete: wait for its remaining bytes
        if len(full_text) > len(prefix_text) and full_text.startswith(prefix_text):
            self._text += full_text[len(prefix_text) :]
        elif full_text != prefix_text:
            # Some decoders rewrite earlier text once more tokens arrive; re-decode the whole output.
            self._text = self._decode(self.output_ids)
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)

    def _release(self, final: bool) -> tuple[str, bool]:
        text = self._text
        if self.stop:
            # A match cannot start before what was already returned (that part was held back), so only the
            # tail needs searching.
            start = max(0, self._emitted - self._max_stop_len + 1)
            best: int | None = None
            for s in self.stop:
                i = text.find(s, start)
                if i != -1 and (best is None or i < best):
                    best, self.matched_stop = i, s
            if best is not None:
                cut = max(best + len(self.matched_stop) if self._keep_stop else best, self._emitted)
                delta = text[self._emitted : cut]
                self._text = text[:cut]
                self._emitted = cut
                return delta, True
        end = len(text) if final else len(text) - self._held_back(text)
        delta = text[self._emitted : end] if end > self._emitted else ""
        self._emitted = max(self._emitted, end)
        return delta, False

    def _held_back(self, text: str) -> int:
        """Length of the longest tail of `text` that is the start of some stop string."""
        limit = min(self._max_stop_len - 1, len(text) - self._emitted)
        for n in range(limit, 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
