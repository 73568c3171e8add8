"""The transformers baseline the engine benchmarks measure against: one greedy generate() over a left-padded
batch, every prompt given exactly the same number of new tokens (EOS ignored through min_new_tokens)."""

from __future__ import annotations

import torch


def generate_left_padded(model, prompts: list[list[int]], out_len: int, pad_id: int) -> int:
    """Runs `prompts` as one batch, left-padded with `pad_id`, on the model's device; returns the output
    tokens generated (`out_len` a prompt)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=out_len,
            min_new_tokens=out_len,
            do_sample=False,
            pad_token_id=pad_id,
        )
    return int((out.shape[1] - width) * len(prompts))
