"""`--grammar-backend xgrammar`: constraints compiled by xgrammar, matched by its GrammarMatcher."""

from __future__ import annotations

from typing import Any

from tokenspeed.runtime.grammar.matcher import GrammarState


class XGrammarCompiler:
    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool
    ) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        self.stop_token_ids = list(stop_token_ids)
        self.any_whitespace = any_whitespace

    def compile(self, kind: str, text: str) -> Any:
        c = self._compiler
        if kind == "json_schema":
            return c.compile_json_schema(text, any_whitespace=self.any_whitespace, strict_mode=True)
        if kind == "regex":
            return c.compile_regex(text)
        return c.compile_grammar(text)

    def matcher(self, compiled: Any) -> GrammarState:
        return GrammarState(
            self._xgr.GrammarMatcher(compiled, override_stop_tokens=self.stop_token_ids or None)
        )
