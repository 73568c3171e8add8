"""What every sampling backend does to the logits before drawing, and the logprobs read from them.

`logit_bias` (OpenAI's token id -> bias) and a grammar's token bitmask change the logits the sampler
draws from; the logprobs a request asks for (the chosen token's and the `top_logprobs` most likely) are
read from those same adjusted logits, as the OpenAI API documents. Which rows need what is decided from
host data, and the bias and bitmask reach the device with non-blocking copies: nothing here waits for
the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenspeed.runtime.layers.sampling.host_tensors import to_device

# The bitmask packs 32 tokens per int32 word, bit i of word w allowing token 32 * w + i (xgrammar's layout).
_BITS = 32


def apply_logit_bias(logits: torch.Tensor, reqs: Sequence) -> torch.Tensor:
    """float32 logits with each request's bias added (a new tensor when any row has a bias)."""
    rows, cols, vals = [], [], []
    vocab = logits.shape[1]
    for i, r in enumerate(reqs):
        for tok, val in (r.sampling.logit_bias or {}).items():
            if 0 <= int(tok) < vocab:  # ids past the logits' width were refused by the front end
                rows.append(i)
                cols.append(int(tok))
                vals.append(float(val))
    if not rows:
        return logits
    out = logits.float().clone()
    dev = logits.device
    out.index_put_(
        (to_device(rows, torch.int64, dev), to_device(cols, torch.int64, dev)),
        to_device(vals, torch.float32, dev),
        accumulate=True,
    )
    return out


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Disallowed tokens (bit 0 in `bitmask`, [S, ceil(V / 32)] int32 on the device) get -inf."""
    rows, vocab = logits.shape
    shifts = torch.arange(_BITS, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(rows, -1)[:, :vocab]
    return logits.masked_fill(~allowed, float("-inf"))


def logprobs_wanted(reqs: Sequence) -> tuple[bool, int]:
    """(any row wants logprobs, the most alternatives any row wants)."""
    want = [r.sampling for r in reqs if r.sampling.logprobs]
    return bool(want), max((sp.top_logprobs for sp in want), default=0)


def read_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """([S] logprob of each chosen token, [S, top] ids and logprobs of the most likely, or None)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    if top <= 0:
        return chosen, None, None
    top_lp, top_ids = logp.topk(min(top, logp.shape[1]), dim=-1)
    return chosen, top_ids, top_lp
