"""Server-wide admission: how much work the server holds at once before it turns new requests away.

Every sequence a request asks for is held from its start to its end, with its prompt tokens. Past
`--max-queued-requests` sequences or `--max-queued-tokens` prompt tokens (default 8x the KV cache: a queue
that deep already waits minutes), a new request is answered 503 with Retry-After (`http_outcomes`) at once,
instead of joining a queue so long that every client behind it times out. A request that could never be
admitted, even by an idle server, is a 400 naming the flag instead: retrying it would not help.
"""

from __future__ import annotations

from tokenspeed.runtime.entrypoints.openai.errors import APIError, bad_request
from tokenspeed.runtime.entrypoints.server_state import ServerState

_KV_MULTIPLE = 8


def queued_token_limit(state: ServerState) -> int | None:
    if state.server_args.max_queued_tokens is not None:
        return state.server_args.max_queued_tokens
    limits = state.llm.limits
    return _KV_MULTIPLE * limits.max_total_tokens if limits is not None else None


def admit(state: ServerState, sequences: int, tokens: int) -> None:
    """Raise when `sequences` more sequences of `tokens` prompt tokens in all would take the server past
    its admission limits: 503 (retry later) or, for a request too large even for an idle server, 400."""
    max_seqs = state.server_args.max_queued_requests
    max_tokens = queued_token_limit(state)
    if sequences > max_seqs:
        raise bad_request(
            f"the request asks for {sequences} sequences (prompts x n); this server holds at most {max_seqs} "
            "at once (--max-queued-requests): split the request",
            param="n",
            code="too_many_prompts",
        )
    if max_tokens is not None and tokens > max_tokens:
        raise bad_request(
            f"the request's prompts hold {tokens} tokens (x n); this server holds at most {max_tokens} "
            "at once (--max-queued-tokens): split the request",
            param="prompt",
            code="too_many_tokens",
        )
    held_seqs, held_tokens = state.llm.num_inflight, state.llm.inflight_tokens
    if held_seqs + sequences > max_seqs or (max_tokens is not None and held_tokens + tokens > max_tokens):
        raise APIError(
            503,
            f"the server is at its admission limit: it holds {held_seqs} sequences of at most {max_seqs} "
            f"(--max-queued-requests) and {held_tokens} prompt tokens of at most {max_tokens} "
            "(--max-queued-tokens); retry after the Retry-After delay",
            code="server_overloaded",
        )
