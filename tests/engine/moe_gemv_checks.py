"""The MoE GEMV (`moe/kernels/gemv.py`) run by Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, set by
tests/engine/test_moe_gemv_interpreter.py before Triton is imported): 1-4 tokens, top-2 and top-8, remote
experts (id < 0), hidden and intermediate sizes that no block divides, every prefetch depth, the down
kernel split over pairs (atomics, or merged by the last to arrive) or not, the gate/up kernel split over K
(merged by the last to arrive; a split count that leaves one split empty), and FP8 experts with
per-channel and block scales, against the float32 reference loop (`backend.torch_experts`). Prints one
JSON object: case -> relative error.

float32 activations and weights: products are exact, so the bound checks the indexing, not rounding.
"""

from __future__ import annotations

import json

import torch

from tokenspeed.runtime.layers.quantization.fp8 import ExpertScales
from tokenspeed.runtime.layers.quantization.fp8_math import quantize_block, quantize_per_channel
from tokenspeed.runtime.moe.backend import count_routed, torch_experts
from tokenspeed.runtime.moe.kernels.gemv import (
    MoeGemvConfig,
    Routing,
    arrival_tiles,
    moe_gemv,
    moe_gemv_routed,
)
from tokenspeed.runtime.moe.kernels.routing import fused_route

# E experts, hidden 70 (no BLOCK_K divides it), intermediate 36 (no BLOCK_N or down BLOCK_K divides it)
E, HIDDEN, INTER = 10, 70, 36
CONFIGS = {
    "p1": MoeGemvConfig(block_n=8, block_k=32, down_block_h=4, down_block_k=16),
    "p2split": MoeGemvConfig(
        block_n=16, block_k=16, prefetch=2, down_block_h=8, down_block_k=16, down_prefetch=2, down_split=3
    ),
    "p0h1": MoeGemvConfig(
        block_n=4, block_k=64, prefetch=0, down_block_h=1, down_block_k=64, down_prefetch=0
    ),
    # gate/up K split: 70 / 16 = 5 chunks over 4 splits of 2 (the last empty), and 3 over 2 with both split
    "gus4": MoeGemvConfig(block_n=8, block_k=16, prefetch=2, split=4, down_block_h=4, down_block_k=16),
    "gus2ds2": MoeGemvConfig(
        block_n=16, block_k=32, prefetch=1, split=2, down_block_h=8, down_block_k=16, down_split=2
    ),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def _routing(tokens: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = torch.softmax(torch.randn(tokens, E), -1).topk(top_k, dim=-1)
    ids = ids.to(torch.int32)
    ids[0, 0] = -1  # an expert held by another rank: contributes nothing
    if tokens > 2:
        ids[2, :] = -1  # a token whose experts are all remote: zeros
    return weights, ids


def bf16_like() -> dict[str, float]:
    out = {}
    w13, w2 = torch.randn(E, 2 * INTER, HIDDEN) * 0.05, torch.randn(E, HIDDEN, INTER) * 0.05
    for top_k in (2, 8):
        for tokens in (1, 2, 3, 4):
            x = torch.randn(tokens, HIDDEN)
            weights, ids = _routing(tokens, top_k)
            ref = torch_experts(x, w13, w2, weights, ids)
            # one config a case, in turn (the interpreter is slow): each config meets both top-k
            for name in [list(CONFIGS)[(tokens + (top_k == 8)) % len(CONFIGS)]]:
                got = moe_gemv(x, w13, w2, weights, ids, CONFIGS[name])
                assert got.shape == x.shape and got.dtype == x.dtype
                out[f"t{tokens}_k{top_k}_{name}"] = _rel(got, ref)
                if CONFIGS[name].down_split > 1 or CONFIGS[name].split > 1:  # merged by arrival, twice
                    arrivals = torch.zeros(
                        arrival_tiles(tokens, top_k, INTER, HIDDEN, CONFIGS[name]), dtype=torch.int32
                    )
                    merged = [
                        moe_gemv(x, w13, w2, weights, ids, CONFIGS[name], arrivals=arrivals) for _ in range(2)
                    ]
                    out[f"arrive_t{tokens}_k{top_k}_{name}"] = _rel(merged[0], ref)
                    out[f"arrive_t{tokens}_k{top_k}_{name}_repeat_differs"] = float(
                        (merged[0] != merged[1]).sum()
                    )
                    out[f"arrive_t{tokens}_k{top_k}_{name}_arrivals_left"] = float(arrivals.abs().sum())
                if tokens > 2:
                    out[f"t{tokens}_k{top_k}_{name}_remote_token_max"] = float(got[2].abs().max())
    return out


def fp8() -> dict[str, float]:
    out = {}
    w13, w2 = torch.randn(E, 2 * INTER, HIDDEN) * 0.05, torch.randn(E, HIDDEN, INTER) * 0.05
    x = torch.randn(3, HIDDEN)
    weights, ids = _routing(3, 4)
    for label, block in (("channel", None), ("block16", (16, 16))):
        quant = quantize_per_channel if block is None else (lambda t, b=block: quantize_block(t, b))
        (q13, s13), (q2, s2) = quant(w13), quant(w2)
        scales = ExpertScales(s13, s2, block)
        ref = torch_experts(x, q13, q2, weights, ids, scales)
        for name in ("p1",) if block is None else ("p2split", "gus2ds2"):
            out[f"fp8_{label}_{name}"] = _rel(moe_gemv(x, q13, q2, weights, ids, CONFIGS[name], scales), ref)
    return out


def routed() -> dict[str, float]:
    """The routing computed in the GEMV's first launch (`Routing`) against the routing kernel's own choice
    (`routing.fused_route`): the same expert ids and counts, weights within a float32 rounding, and the
    output against the reference loop over the routing kernel's choice. A tie in the logits (two experts
    equally likely) goes to the lower id in both."""
    out = {}
    w13, w2 = torch.randn(E, 2 * INTER, HIDDEN) * 0.05, torch.randn(E, HIDDEN, INTER) * 0.05
    cases = ((1, 2, True, "p1"), (3, 8, False, "p2split"), (2, 8, True, "p0h1"), (2, 4, True, "gus4"))
    for tokens, top_k, renorm, name in cases:
        x = torch.randn(tokens, HIDDEN)
        logits = torch.randn(tokens, E)
        logits[0, 3] = logits[0, 7] = logits[0].max() + 1.0  # a tie at the top
        mask = torch.ones(tokens, dtype=torch.int32)
        mask[-1] = 0  # a CUDA-graph padding row: routed, never counted
        # (the routing kernel's own counting runs only on a GPU: the interpreter takes no vector mask on an
        # atomic) the reference counts are its choices of the live rows
        ref_w, ref_ids = fused_route(logits, top_k, renorm)
        want_counts = torch.zeros(E, dtype=torch.int32)
        count_routed(want_counts, ref_ids, mask)
        counts = torch.zeros(E, dtype=torch.int32)
        routing = Routing(logits, top_k, renorm, counts, mask)
        arrivals = torch.zeros(
            max(1, arrival_tiles(tokens, top_k, INTER, HIDDEN, CONFIGS[name])), dtype=torch.int32
        )
        got, got_w, got_ids = moe_gemv_routed(x, w13, w2, routing, CONFIGS[name], arrivals=arrivals)
        key = f"routed_t{tokens}_k{top_k}_{'renorm' if renorm else 'plain'}_{name}"
        out[f"{key}_ids_differ"] = float((got_ids != ref_ids).sum())
        out[f"{key}_counts_differ"] = float((counts - want_counts).abs().sum())
        out[f"{key}_weight_max_diff"] = float((got_w - ref_w).abs().max())
        out[f"{key}_error"] = _rel(got, torch_experts(x, w13, w2, ref_w, ref_ids))
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps({**bf16_like(), **fp8(), **routed()}))
