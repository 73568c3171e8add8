"""The sampling kernel (`kernels/sampling.py`) run by Triton's interpreter on the CPU (`TRITON_INTERPRET=1`,
set by tests/engine/test_sampling_triton_interpreter.py before Triton is imported): prints one JSON object,
per rule, of whether every drawn token obeys it.

Rows of random logits and random settings, each drawn with several seeds: a greedy row (temperature 0)
or top-k 1 takes the argmax; a draw is always among the row's k largest logits, inside its top-p nucleus
(the smallest set of largest probabilities, after top-k, whose mass reaches p) and at or above min-p of
its most likely token; the same seed draws the same token.
"""

from __future__ import annotations

import json

import torch

from tokenspeed.runtime.kernels.sampling import sample_from_logits

ROWS, VOCAB, SEEDS = 24, 300, 4


def _allowed(x: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The tokens a row of temperature-scaled logits `x` may draw, with a margin of 1e-4 on each
    threshold for the kernel's bisection (it finds each threshold to 2^-24 of the logits' range)."""
    keep = torch.ones_like(x, dtype=torch.bool)
    if 0 < top_k < x.numel():
        keep &= x >= x.topk(top_k).values[-1] - 1e-4
    probs = torch.softmax(torch.where(keep, x, float("-inf")), -1)
    if top_p < 1.0:
        p, order = probs.sort(descending=True)
        before = p.cumsum(0) - p  # the mass of the more likely tokens
        nucleus = torch.zeros_like(keep)
        nucleus[order[before < top_p + 1e-4]] = True
        keep &= nucleus
    if min_p > 0.0:
        keep &= x >= x.max() + torch.log(torch.tensor(min_p)) - 1e-4
    return keep


def check() -> dict[str, bool]:
    logits = torch.randn(ROWS, VOCAB) * 3
    temp = torch.rand(ROWS) * 1.5 + 0.2
    temp[:4] = 0.0  # greedy rows
    top_k = torch.randint(0, 40, (ROWS,), dtype=torch.int32)
    top_k[4:6] = 1
    top_p = torch.where(torch.rand(ROWS) < 0.5, 1.0, torch.rand(ROWS) * 0.9 + 0.05)
    min_p = torch.where(torch.rand(ROWS) < 0.5, 0.0, torch.rand(ROWS) * 0.3)
    draws = [
        sample_from_logits(
            logits, temp, top_k, top_p, min_p, torch.arange(ROWS, dtype=torch.int64) + 1000 * s
        )
        for s in range(SEEDS)
    ]
    again = sample_from_logits(logits, temp, top_k, top_p, min_p, torch.arange(ROWS, dtype=torch.int64))
    argmax = logits.argmax(-1)
    allowed = [
        _allowed(logits[r] / temp[r], int(top_k[r]), float(top_p[r]), float(min_p[r])) for r in range(4, ROWS)
    ]
    return {
        "greedy_is_argmax": all(torch.equal(d[:4], argmax[:4]) for d in draws),
        "top_k_1_is_argmax": all(torch.equal(d[4:6], argmax[4:6]) for d in draws),
        "draws_obey_top_k_top_p_min_p": all(
            bool(allowed[r - 4][d[r]]) for d in draws for r in range(4, ROWS)
        ),
        "same_seed_same_tokens": torch.equal(again, draws[0]),
        "seeds_vary_the_draws": any(not torch.equal(d[6:], draws[0][6:]) for d in draws[1:]),
    }


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps(check()))
