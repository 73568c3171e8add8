"""`--grammar-backend llguidance`: constraints checked by llguidance (PyPI `llguidance`, the library behind
vLLM's `guidance` backend), one LLMatcher per request.

llguidance builds its token automaton lazily while matching, so "compiling" a constraint is turning it
into llguidance's grammar text and validating it against the tokenizer: errors surface then, as a 400
naming the field. EBNF is taken in the GBNF spelling xgrammar reads (or llguidance's Lark) and converted.
The bitmask layout is xgrammar's (bit i of word w allows token 32 * w + i), so the sampler is the same.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenspeed.runtime.grammar.matcher import allow_only


def _one_line(error: str) -> str:
    """llguidance's report on one line: where, and the parser's own `error:` line (a caret drawing between)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    cause = next((line for line in lines[1:] if line.startswith("error:")), None)
    return lines[0] if cause is None else f"{lines[0].rstrip(':')}: {cause[len('error:') :].strip()}"


class LLGuidanceState:
    """One request's position in its grammar (the GrammarState interface: fill, accept)."""

    def __init__(self, matcher: Any, stop_token_ids: list[int]) -> None:
        self._matcher = matcher
        self._stop_token_ids = stop_token_ids

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self._matcher.is_stopped():
            # ignore_eos kept the request going past its completed grammar: only stop tokens may follow
            allow_only(bitmask, row, self._stop_token_ids)
            return
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, row)

    def accept(self, token_id: int) -> bool:
        if self._matcher.is_stopped():
            return True  # the stop token was accepted; anything after it is dropped by the scheduler
        return bool(self._matcher.consume_token(token_id))


class LLGuidanceCompiler:
    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool
    ) -> None:
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self._tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=list(stop_token_ids) or None
        )
        self.stop_token_ids = list(stop_token_ids)
        self.any_whitespace = any_whitespace

    def compile(self, kind: str, text: str) -> str:
        m = self._llg.LLMatcher
        if kind == "json_schema":
            grammar = m.grammar_from_json_schema(text, defaults={"whitespace_flexible": self.any_whitespace})
        elif kind == "regex":
            grammar = m.grammar_from_regex(text)
        else:
            from llguidance.gbnf_to_lark import any_to_lark

            try:
                grammar = m.grammar_from_lark(any_to_lark(text))
            except Exception as exc:  # the converter raises plain Exceptions naming the rule
                raise ValueError(f"not a GBNF or Lark grammar llguidance reads: {exc}") from exc
        error = m.validate_grammar(grammar, self._tokenizer)
        if error:
            raise ValueError(_one_line(error))
        return grammar

    def matcher(self, compiled: str) -> LLGuidanceState:
        return LLGuidanceState(
            self._llg.LLMatcher(self._tokenizer, compiled, log_level=0), self.stop_token_ids
        )
