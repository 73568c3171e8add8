"""How many KV pages the pool gets.

In order of precedence: `--max-total-tokens`; on the CPU, `--cpu-kv-cache-memory-gb` (capped at what
`max_num_seqs` full-length requests could ever use, so a tiny model does not zero a gigabyte); on a GPU,
the free memory measured after the weights are loaded, through the memory model the console's planner
predicts with (`tokenspeed.config.memory_model`): budget = free - total * (1 - utilization).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenspeed.config import memory_model
from tokenspeed.runtime.cache.kv_pool import KVPoolSpec

_GIB = 1 << 30


def gpu_num_pages(spec: KVPoolSpec, free_bytes: int, total_bytes: int, utilization: float) -> int:
    """Pages of the pool (page 0 included) for a GPU with `free_bytes` free of `total_bytes` now."""
    budget = memory_model.kv_budget_bytes(free_bytes, total_bytes, utilization)
    tokens = memory_model.kv_tokens_for_budget(budget, spec.bytes_per_token(), spec.block_size)
    if tokens < spec.block_size:
        raise ValueError(
            f"no GPU memory left for the KV cache: {free_bytes / _GIB:.2f} GiB free after loading the model, "
            f"--gpu-memory-utilization {utilization} keeps {total_bytes * (1 - utilization) / _GIB:.2f} GiB "
            "away; raise --gpu-memory-utilization, use a smaller model or more tensor parallelism"
        )
    return tokens // spec.block_size + 1


def plan_num_pages(args: Any, spec: KVPoolSpec, device: torch.device, max_model_len: int) -> int:
    """Pages of the pool, page 0 (reserved) included."""
    bs = spec.block_size
    if args.max_total_tokens is not None:
        if args.max_total_tokens < bs:
            raise ValueError(
                f"--max-total-tokens {args.max_total_tokens} is smaller than one page (--block-size {bs}); "
                f"use at least {bs}"
            )
        return args.max_total_tokens // bs + 1
    if device.type == "cpu":
        budget = int(float(args.cpu_kv_cache_memory_gb) * _GIB)
        useful = (args.max_num_seqs or 1) * -(-max_model_len // bs)
        pages = min(spec.pages_for_bytes(budget), useful)
        if pages < 1:
            raise ValueError(
                f"--cpu-kv-cache-memory-gb {args.cpu_kv_cache_memory_gb} holds no page of {bs} tokens "
                f"({spec.bytes_per_token() * bs} bytes a page); raise it or pass --max-total-tokens"
            )
        return pages + 1
    if device.type == "cuda":
        # Blocks the loader freed stay cached by torch's allocator; they are free for the pool too.
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        return gpu_num_pages(spec, free, total, float(args.gpu_memory_utilization))
    raise ValueError(f"--device {device.type}: no rule to size the KV cache; pass --max-total-tokens")
