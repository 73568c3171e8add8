"""The checks every entry point applies to a prompt before it reaches a scheduler, with one wording.

The HTTP front end (`AsyncLLM.check_prompt`), the in-process `EngineCore` and the offline Engine's ranks
(`RankClient`) all call these, so a prompt is refused the same way, in the same words, wherever it comes in.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenspeed.runtime.engine.io_struct import ReadyMessage
from tokenspeed.runtime.engine.request_state import ModelLimits

# Token ids travel as int32 tensors: the bound when the vocabulary size is not known.
TOKEN_ID_LIMIT = 2**31


class PromptTooLong(ValueError):
    """The prompt does not fit the context: the HTTP layer answers 400 (context_length_exceeded)."""

    param = "prompt"  # the request field the HTTP error names


class MaxTokensTooLarge(PromptTooLong):
    """The prompt fits but prompt + max_tokens does not: a 400 as vLLM and SGLang answer, never a silent cap."""

    param = "max_tokens"


def limits_from_ready(ready: Sequence[ReadyMessage]) -> ModelLimits:
    """The limits a prompt is checked against: the tightest of every scheduler rank's ready message."""
    return ModelLimits(
        max_total_tokens=min(r.max_total_tokens for r in ready),
        max_req_input_len=min(r.max_req_input_len for r in ready),
        max_model_len=min(r.max_model_len for r in ready),
    )


def check_not_empty(ids: list[int]) -> None:
    if not ids:
        raise ValueError("prompt: it is empty; send at least one token")


def check_fits(num_tokens: int, limits: ModelLimits) -> None:
    """PromptTooLong when a prompt of `num_tokens` tokens leaves no room to generate in."""
    if num_tokens > limits.max_req_input_len:
        raise PromptTooLong(
            f"the prompt has {num_tokens} tokens; this server accepts at most {limits.max_req_input_len} "
            f"(max model length {limits.max_model_len}, KV cache {limits.max_total_tokens} tokens). Shorten "
            "the prompt, or raise --max-model-len / --max-total-tokens"
        )


def room_for(num_tokens: int, max_new_tokens: int | None, limits: ModelLimits) -> int:
    """The tokens a request may generate: `max_new_tokens` when it fits the context (None: all that fits);
    MaxTokensTooLarge when it does not."""
    room = max(0, limits.max_model_len - num_tokens)
    if max_new_tokens is not None and max_new_tokens > room:
        raise MaxTokensTooLarge(
            f"max_tokens: the prompt has {num_tokens} tokens and asks for {max_new_tokens} more, but the "
            f"context holds {limits.max_model_len} (--max-model-len); ask for at most {room} "
            "(max_tokens, or max_new_tokens on /generate)"
        )
    return room if max_new_tokens is None else max_new_tokens


def check_token_ids(param: str, ids: list[int], vocab_size: int | None) -> None:
    """ValueError naming `param` for an id outside the model's vocabulary (or, when its size is not known,
    outside what a token id can be)."""
    limit = vocab_size or TOKEN_ID_LIMIT
    bad = next((t for t in ids if not 0 <= t < limit), None)
    if bad is not None:
        raise ValueError(f"{param}: token id {bad} is outside the vocabulary [0, {limit}) of this model")


def check_prompt(ids: list[int], limits: ModelLimits, vocab_size: int | None) -> None:
    """The whole prompt check: not empty, fits the context, every id in the vocabulary."""
    check_not_empty(ids)
    check_fits(len(ids), limits)
    check_token_ids("prompt", ids, vocab_size)
