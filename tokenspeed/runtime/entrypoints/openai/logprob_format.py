"""Logprobs as the OpenAI API spells them: chat's `content` entries and completions' parallel lists.

`tops` holds, per output token, [token id, logprob] pairs of the most likely tokens (most likely first),
read from the same adjusted logits the token was sampled from.
"""

from __future__ import annotations

import math
from typing import Any

# A token the grammar or a logit bias ruled out has logprob -inf, which JSON cannot carry (a response holding
# it failed to render, a 500); vLLM reports such a logprob as -9999.0, and clients expect that spelling.
IMPOSSIBLE_LOGPROB = -9999.0


def finite_logprob(value: float | None) -> float | None:
    """`value`, or -9999.0 where it is not finite."""
    if value is None or math.isfinite(value):
        return value
    return IMPOSSIBLE_LOGPROB


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
            alts.append({"token": alt, "logprob": finite_logprob(alt_lp), "bytes": list(alt.encode("utf-8"))})
        out.append({"token": text, "logprob": finite_logprob(lp), "bytes": list(text.encode("utf-8")), "top_logprobs": alts})
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
                m.setdefault(_text(tokenizer, alt_id), finite_logprob(alt_lp))
            top_maps.append(m)
    return {"tokens": tokens, "token_logprobs": [finite_logprob(lp) for lp in lps], "top_logprobs": top_maps, "text_offset": offsets}


# Prompt logprobs arrive per prompt token as None (the first token, and those before logprob_start_len) or
# [logprob, rank, [[token id, logprob], ...] most likely first], from the model's raw logits.


def vllm_prompt_logprobs(
    tokenizer: Any, prompt_ids: list[int], entries: list, top: int
) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: per prompt token None or {token id: {logprob, rank, decoded_token}}, the
    prompt's own token first, then the `top` most likely ones (rank 1, 2, ...)."""
    out: list[dict[str, Any] | None] = []
    for tid, entry in zip(prompt_ids, entries, strict=True):
        if entry is None:
            out.append(None)
            continue
        lp, rank, alts = entry
        m = {str(tid): {"logprob": finite_logprob(lp), "rank": rank, "decoded_token": _text(tokenizer, tid)}}
        for r, (alt_id, alt_lp) in enumerate(alts[:top], start=1):
            m.setdefault(
                str(int(alt_id)), {"logprob": finite_logprob(alt_lp), "rank": r, "decoded_token": _text(tokenizer, alt_id)}
            )
        out.append(m)
    return out


def input_logprobs(prompt_ids: list[int], entries: list, start: int) -> dict[str, Any]:
    """SGLang's /generate `input_token_logprobs` ([logprob, token id, text (not sent)] per prompt token
    from `start` (logprob_start_len) on, the first token's logprob None) and `input_top_logprobs`."""
    tokens, tops = [], []
    for tid, entry in zip(prompt_ids[start:], entries[start:], strict=True):
        tokens.append([None if entry is None else entry[0], int(tid), None])
        tops.append(None if entry is None else [[alt_lp, int(alt), None] for alt, alt_lp in entry[2]])
    return {"input_token_logprobs": tokens, "input_top_logprobs": tops}


def completion_prompt_logprobs(
    tokenizer: Any, prompt_ids: list[int], entries: list, top: int
) -> dict[str, Any]:
    """The prompt part of a completion's logprobs with `echo` (OpenAI's legacy shape): the first token's
    logprob and alternatives are None; text offsets count from the start of the echoed prompt."""
    tokens = [_text(tokenizer, t) for t in prompt_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    lps, top_maps = [], []
    for entry in entries:
        if entry is None:
            lps.append(None)
            top_maps.append(None)
            continue
        lps.append(entry[0])
        m: dict[str, float] = {}
        for alt_id, alt_lp in entry[2][:top]:
            m.setdefault(_text(tokenizer, alt_id), alt_lp)
        top_maps.append(m)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top_maps, "text_offset": offsets}


def joined(first: dict[str, Any], then: dict[str, Any] | None) -> dict[str, Any]:
    """Two runs of completion logprobs as one (the echoed prompt's, then the completion's)."""
    if then is None:
        return first
    return {key: list(first[key]) + list(then[key] or []) for key in first}
