"""How many KV pages the pool gets: --max-total-tokens, else the CPU memory budget."""

from types import SimpleNamespace

import pytest
import torch

from tokenspeed.runtime.cache.kv_pool import KVPoolSpec
from tokenspeed.runtime.execution.kv_sizing import plan_num_pages

SPEC = KVPoolSpec(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32, block_size=4)  # 512 B/token
CPU = torch.device("cpu")


def args(**kw):
    base = dict(max_total_tokens=None, cpu_kv_cache_memory_gb=1.0, max_num_seqs=8, gpu_memory_utilization=0.9)
    return SimpleNamespace(**{**base, **kw})


def test_max_total_tokens_wins_and_page_zero_is_extra():
    assert plan_num_pages(args(max_total_tokens=100), SPEC, CPU, max_model_len=64) == 26
    with pytest.raises(ValueError, match="--max-total-tokens 3 is smaller than one page"):
        plan_num_pages(args(max_total_tokens=3), SPEC, CPU, max_model_len=64)


def test_cpu_budget_is_capped_by_what_requests_could_use():
    # 1 GiB would hold 524288 pages; 8 requests of 64 tokens can use 8 * 16 pages.
    assert plan_num_pages(args(), SPEC, CPU, max_model_len=64) == 8 * 16 + 1
    budget_gb = 40 * 4 * 512 / (1 << 30)  # exactly 40 pages
    assert plan_num_pages(args(cpu_kv_cache_memory_gb=budget_gb), SPEC, CPU, max_model_len=4096) == 41
    with pytest.raises(ValueError, match="--cpu-kv-cache-memory-gb"):
        plan_num_pages(args(cpu_kv_cache_memory_gb=1e-9), SPEC, CPU, max_model_len=64)
