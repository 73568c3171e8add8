"""Logprobs as the OpenAI API spells them: chat's `content` entries and completions' parallel lists.

`tops` holds, per output token, [token id, logprob] pairs of the most likely tokens (most likely first),
read from the same adjusted logits the token was sampled from.
"""

from __future__ import annotations

from typing import Any


def _text(tokenizer: Any, tid: int) -> str:
    return tokenizer.decode([int(tid)]) if tokenizer is not None else str(int(tid))


def chat_entries(
    tokenizer: Any, ids: list[int], lps: list[float] | None, tops: list[list[list[float]]] | None
) -> list[dict[str, Any]]:
    if lps is None:
        return []
    out = []
    for k, (tid, lp) in enumerate(zip(ids, lps, strict=False)):
        text = _text(tokenizer, tid)
        alts = []
        for alt_id, alt_lp in tops[k] if tops is not None and k < len(tops) else []:
            alt = _text(tokenizer, alt_id)
            alts.append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode("utf-8"))})
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": alts})
    return out


def completion_logprobs(
    tokenizer: Any,
    ids: list[int],
    lps: list[float] | None,
    tops: list[list[list[float]]] | None,
    offset: int,
) -> dict[str, Any] | None:
    if lps is None:
        return None
    tokens = [_text(tokenizer, t) for t in ids]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top_maps = None
    if tops is not None:
        # OpenAI's shape: one {token text: logprob} per position (texts that collide keep the likelier).
        top_maps = []
        for alts in tops[: len(tokens)]:
            m: dict[str, float] = {}
            for alt_id, alt_lp in alts:
                m.setdefault(_text(tokenizer, alt_id), alt_lp)
            top_maps.append(m)
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": top_maps, "text_offset": offsets}
