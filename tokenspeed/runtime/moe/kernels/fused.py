"""Fused MoE experts in Triton: the experts of one layer in three or four launches, no host sync.

The torch reference loops over `unique(topk_ids).tolist()` (a host sync per layer, and one small GEMM per
expert: over a hundred launches per layer at batch 1). Here, by the step's token count (`configs.py`):

- small batches: every routed (token, expert) pair is its own block (`pairs_as_blocks`, no launch), so
  only the routed experts' rows are read and nothing is grouped (3 launches);
- larger ones: `align.py` groups the pairs into blocks of BLOCK_M rows per expert (1 launch), so
  each expert's weights are read once for all its tokens (4 launches).

Then `gemm.py` runs gate|up with SiLU-and-mul in the epilogue and down scaled by the routing weight
on the tensor cores, and `sum_pairs` adds each token's k rows.

Every shape depends only on the number of tokens, so the layer is captured whole in a CUDA graph.
Expert ids < 0 (experts held by another rank under expert parallelism) contribute zero.
"""

from __future__ import annotations

import torch

from tokenspeed.runtime.layers.quantization.fp8 import ExpertScales
from tokenspeed.runtime.moe.kernels.align import align_by_expert, pairs_as_blocks
from tokenspeed.runtime.moe.kernels.configs import MoeKernelConfig, pick, table_for
from tokenspeed.runtime.moe.kernels.gemm import down, gate_up_silu, sum_pairs


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoeKernelConfig | None = None,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_* [T, k] -> [T, H].
    `scales`: those of FP8 w13 / w2 (read as e4m3, multiplied in x's dtype)."""
    t = x.shape[0]
    if t == 0:
        return torch.empty_like(x)
    if w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_experts needs expert weights contiguous in their last dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if config is None:
        config = pick(table_for(torch.cuda.get_device_name(x.device)), t)
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
    ids = ids.contiguous()
    weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
    weights = weights.contiguous()
    if config.pairs:
        al = pairs_as_blocks(ids, config.block_m)
    else:
        al = align_by_expert(ids, w13.shape[0], config.block_m)
    s13 = (scales.w13_scale, scales.block) if scales is not None else None
    s2 = (scales.w2_scale, scales.block) if scales is not None else None
    act = gate_up_silu(x, w13, al, ids.shape[1], config, s13)
    per_pair = down(act, w2, al, weights.view(-1), config, s2)
    return sum_pairs(per_pair, ids, x.dtype)
