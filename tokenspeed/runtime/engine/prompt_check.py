"""The checks every entry point applies to a prompt before it reaches a scheduler, with one wording."""

from __future__ import annotations


def check_prompt(
    rid: str,
    ids: list[int],
    max_req_input_len: int,
    max_model_len: int,
    max_total_tokens: int,
    vocab_size: int | None,
) -> None:
    """ValueError naming the problem and the fix for a prompt that is empty, too long or off-vocabulary."""
    if not ids:
        raise ValueError(f"request {rid}: the prompt is empty; send at least one token")
    if len(ids) > max_req_input_len:
        raise ValueError(
            f"request {rid}: the prompt has {len(ids)} tokens, but at most {max_req_input_len} fit "
            f"(max_model_len {max_model_len}, KV cache {max_total_tokens} tokens); shorten the prompt or "
            "raise --max-model-len / --max-total-tokens"
        )
    if vocab_size is not None:
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"request {rid}: token id {bad} is outside the vocabulary [0, {vocab_size})")
