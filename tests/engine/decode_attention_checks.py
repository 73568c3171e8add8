"""The Triton decode attention in two launches and in one (`DecodeLaunch.one_launch`: the last split of each
(request, kv head) merges), run by Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, set by
tests/engine/test_decode_attention_interpreter.py): prints one JSON object with, per case, the relative
error of each mode against PyTorch's attention over the same keys, the largest difference between the two
modes, and whether the one-launch run left its arrival counts at zero (what the next launch, or a replayed
CUDA graph, starts from).

The interpreter runs a grid's programs one after another, so the arrival order is fixed here; on the GPU
any program may arrive last, which tests/gpu/test_attention_backends.py covers.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tokenspeed.runtime.kernels import decode_attention as module
from tokenspeed.runtime.kernels.decode_attention import DecodeLaunch, decode_attention


class _NoStage2:
    """Stands in for the merge kernel while a one-launch run is checked: launching it is an error."""

    def __getitem__(self, grid):
        raise AssertionError("a one-launch decode attention launched stage 2")

# (name, heads, kv heads, head dim, context lengths of the batch's requests, splits)
CASES = (
    ("gqa8_one_request_16_splits", 8, 1, 64, (70,), 16),  # most splits hold 5 keys, the last none
    ("gqa4_three_requests_4_splits", 8, 2, 32, (1, 33, 130), 4),  # a request shorter than its splits
    ("mha_two_requests_2_splits", 4, 4, 64, (64, 9), 2),
    ("gqa2_one_split", 4, 2, 32, (50, 17), 1),  # one split: the program writes the output itself
    ("head_dim_80_3_splits", 6, 2, 80, (40, 41), 3),  # padded head dim, a split count not a power of two
)


def _case(heads: int, kv_heads: int, dim: int, lens: tuple[int, ...], splits: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(heads * 1000 + dim + splits)
    bs, slots = len(lens), 256
    k_buf = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v_buf = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(bs, heads, dim, generator=gen).to(dtype)
    # each request's tokens at scattered slots, as a paged cache holds them
    table = torch.stack([torch.randperm(slots, generator=gen)[:160] for _ in range(bs)]).to(torch.int32)
    rows = torch.arange(bs, dtype=torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    scale = dim**-0.5
    ref = torch.empty(bs, heads, dim)
    for b, n in enumerate(lens):
        idx = table[b, :n].long()
        keys = k_buf[idx].float().transpose(0, 1)[None]
        values = v_buf[idx].float().transpose(0, 1)[None]
        qb = q[b].float().view(1, heads, 1, dim)
        ref[b] = F.scaled_dot_product_attention(qb, keys, values, scale=scale, enable_gqa=True).view(heads, dim)
    return q, k_buf, v_buf, table, rows, seq, scale, ref


def run() -> dict[str, dict[str, float | bool]]:
    out = {}
    for dtype in (torch.float32, torch.float16):
        for name, heads, kv_heads, dim, lens, splits in CASES:
            q, k_buf, v_buf, table, rows, seq, scale, ref = _case(heads, kv_heads, dim, lens, splits, dtype)
            bs = len(lens)
            got = {}
            arrivals = torch.zeros(bs * kv_heads + 3, dtype=torch.int32)
            for one in (False, True):
                o = torch.full_like(q, float("nan"))
                mid_o = torch.full((bs, heads, splits, dim), float("nan"))
                mid_lse = torch.full((bs, heads, splits), float("nan"))
                launch = DecodeLaunch(block_n=16, num_stages=1, one_launch=one)
                stage2 = module._decode_stage2_kernel
                module._decode_stage2_kernel = _NoStage2() if one else stage2
                try:  # twice: the second call starts from the counts the first left behind
                    for _ in range(2):
                        decode_attention(q, k_buf, v_buf, o, table, rows, seq, mid_o, mid_lse, scale, splits,
                                         launch=launch, arrivals=arrivals)  # fmt: skip
                finally:
                    module._decode_stage2_kernel = stage2
                got[one] = o.float()
            key = f"{name}_{str(dtype).removeprefix('torch.')}"
            out[key] = {
                "two_launch_error": float((got[False] - ref).norm() / ref.norm()),
                "one_launch_error": float((got[True] - ref).norm() / ref.norm()),
                "modes_max_diff": float((got[True] - got[False]).abs().max()),
                "arrivals_zero": bool((arrivals == 0).all()),
            }
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
