"""How many KV pages the pool gets.

In order of precedence: `--max-total-tokens`; on the CPU, `--cpu-kv-cache-memory-gb` (capped at what
`max_num_seqs` full-length requests could ever use, so a tiny model does not zero a gigabyte); on a GPU,
the free memory measured after the weights are loaded, minus the share `--gpu-memory-utilization` keeps
away from us: budget = free - total * (1 - utilization).
"""

from __future__ import annotations

from typing import Any

import torch

from tokenspeed.runtime.cache.kv_pool import KVPoolSpec

_GIB = 1 << 30


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
        budget = int(float(getattr(args, "cpu_kv_cache_memory_gb", 1.0)) * _GIB)
        useful = (args.max_num_seqs or 1) * -(-max_model_len // bs)
        pages = min(spec.pages_for_bytes(budget), useful)
        if pages < 1:
            raise ValueError(
                f"--cpu-kv-cache-memory-gb {args.cpu_kv_cache_memory_gb} holds no page of {bs} tokens "
                f"({spec.bytes_per_token() * bs} bytes a page); raise it or pass --max-total-tokens"
            )
        return pages + 1
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        util = args.gpu_memory_utilization
        budget = free - int(total * (1.0 - util))
        pages = spec.pages_for_bytes(budget)
        if pages < 1:
            raise ValueError(
                f"no GPU memory left for the KV cache: {free / _GIB:.2f} GiB free after loading the model, "
                f"--gpu-memory-utilization {util} keeps {total * (1 - util) / _GIB:.2f} GiB away; raise "
                "--gpu-memory-utilization, use a smaller model or more tensor parallelism"
            )
        return pages + 1
    raise ValueError(f"--device {device.type}: no rule to size the KV cache; pass --max-total-tokens")
