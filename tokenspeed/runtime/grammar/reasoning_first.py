"""A JSON-schema constraint deferred past the model's reasoning (`--reasoning-parser`): the grammar lets the
answer open with the `<think>...</think>` section the parser splits off, then holds the rest to the schema.

Only JSON schemas are deferred (response_format, guided_json, required / named tool choice), as the seed's
`--reasoning-parser` describes; a regex or EBNF constraint spells its whole output itself.
"""

from __future__ import annotations

# Any text that does not contain "</think>" (each alternative consumes a prefix of the tag and one
# character that breaks it).
_BODY = (
    'body ::= ([^<] | "<" [^/] | "</" [^t] | "</t" [^h] | "</th" [^i] | "</thi" [^n] | "</thin" [^k] '
    '| "</think" [^>])*'
)
_PREFIX = {
    # the output may open a <think> section (thinking on) or not (thinking off in the template)
    "qwen3": 'root ::= ("<think>" body "</think>" [ \\n]*)?\n' + _BODY,
    # the template opened <think> in the prompt: the output starts inside the reasoning
    "deepseek-r1": 'root ::= body "</think>" [ \\n]*\n' + _BODY,
    "deepseek_r1": 'root ::= body "</think>" [ \\n]*\n' + _BODY,
}


def defer_past_reasoning(parser: str, schema: str, any_whitespace: bool) -> str:
    """EBNF text: the reasoning section of `parser`, then JSON matching `schema`. ValueError naming
    json_schema when the schema does not convert."""
    import xgrammar as xgr

    from tokenspeed.runtime.grammar.backend import clean_error

    try:
        answer = xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace, strict_mode=True)
    except Exception as exc:  # xgrammar raises RuntimeError with the converter's message
        raise ValueError(f"json_schema: {clean_error(exc)}") from exc
    return str(xgr.Grammar.concat(xgr.Grammar.from_ebnf(_PREFIX[parser]), answer))
