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


def limits_from_ready(ready: Sequence[ReadyMessage]) -> ModelLimits:
    """The limits a prompt is checked against: the tightest of every scheduler rank's ready message."""
    return ModelLimits(
        max_total_tokens=min(r.max_total_tokens for r in ready),
        max_req_input_len=min(r.max_req_input_len for r in ready),
        max_model_len=min(r.max_model_len for r in ready),
    )


def check_not_empty(ids: list[int]) -> None:
    if not ids:
        raise ValueError("the prompt is empty: send at least one token")


def check_fits(num_tokens: int, limits: ModelLimits) -> None:
    """PromptTooLong when a prompt of `num_tokens` tokens leaves no room to generate in."""
    if num_tokens > limits.max_req_input_len:
        raise PromptTooLong(
            f"the prompt has {num_tokens} tokens; this server accepts at most {limits.max_req_input_len} "
            f"(max model length {limits.max_model_len}, KV cache {limits.max_total_tokens} tokens). Shorten "
            "the prompt, or raise --max-model-len / --max-total-tokens"
        )


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
