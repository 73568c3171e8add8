"""Prompt lookup (vLLM's `ngram`, SGLang's NGRAM): drafts copied from the request's own earlier tokens.

The longest suffix of prompt + output (at most `max_n` tokens, at least `min_n`) that also occurs earlier
proposes the tokens that followed that earlier occurrence; among equally long matches the most recent wins.
No model runs, so a draft costs only this host-side scan (linear in the context).
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(tokens: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_tokens` draft tokens to follow `tokens`, or [] when no suffix of >= min_n tokens recurs."""
    length = len(tokens)
    if num_tokens <= 0 or length < min_n + 1:
        return []
    last = tokens[-1]
    best_len, best_end = 0, -1
    # Candidate ends j (< length - 1, so something follows) where the last token recurs, newest first.
    for j in range(length - 2, -1, -1):
        if tokens[j] != last:
            continue
        n = 1
        limit = min(max_n, j + 1)
        while n < limit and tokens[j - n] == tokens[length - 1 - n]:
            n += 1
        if n > best_len:
            best_len, best_end = n, j
            if n >= max_n:
                break
    if best_len < min_n:
        return []
    return list(tokens[best_end + 1 : best_end + 1 + num_tokens])
