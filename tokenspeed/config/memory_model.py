"""The memory model of a server on one GPU: the formulas the console's planner predicts with and the
server sizes its KV pool with, so the plan's numbers are the server's numbers.

    free after load = free now - CUDA context - weights (and rotary table) - request table
                      (the planner predicts it from NVML; the server measures it)
    held back       = CUDA-graph pool (+ FlashInfer's workspace)          (held while the pool is sized)
    KV budget       = free after load - held back - total * (1 - gpu_memory_utilization)
    KV tokens       = KV budget // (KV bytes per token * block_size) * block_size

`gpu_memory_utilization` is the seed's meaning: the share of the GPU's *total* memory the server's
static allocations may reach; the rest stays free for prefill activations and other processes. Memory
other processes hold is not free, so it comes out of the KV budget rather than lowering the fraction.
Every function is pure (integers in, integers out) and imports neither torch nor the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

# What a server process holds on its GPU besides the tensors it allocates: the CUDA context, cuBLAS and
# Triton's module images and the caching allocator's rounding. Measured on an H200: the server of
# profiles/llama-3.1-8b-h200.toml (then on flashinfer; bf16, max_model_len 32768), started with 143194 MiB free,
# reported max_total_tokens=874688, which leaves 558 MiB besides its weights, rotary and request tables,
# graph pool and FlashInfer workspace. tests/gpu/test_plan_gpu.py checks it on each H200 run.
CUDA_CONTEXT_BYTES = 560 * MIB
# FlashInfer allocates its workspace after the KV pool, so the pool is sized without it.
FLASHINFER_WORKSPACE_BYTES = 256 * MIB
# The graph pool's allocator rounding and the graphs' own static tensors.
GRAPH_POOL_SLACK_BYTES = 64 * MIB
DEFAULT_MAX_CAPTURE_SIZE = 160

_DTYPE_FLAG_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}


def compute_dtype_bytes(dtype_flag: str, config_dtype: str, device: str) -> int:
    """Bytes of the weights' and KV cache's element: `--dtype`, or for `auto` the checkpoint's bf16/fp16,
    with a float32 checkpoint kept in float32 on the CPU and run in float16 on a GPU."""
    if dtype_flag != "auto":
        return _DTYPE_FLAG_BYTES[dtype_flag]
    if config_dtype.replace("torch.", "") in ("bfloat16", "float16", "half"):
        return 2
    return 4 if device == "cpu" else 2


def kv_dtype_bytes(kv_cache_dtype: str, compute_bytes: int) -> int:
    """Bytes of a KV cache element: one for an FP8 cache (`--kv-cache-dtype fp8_e4m3`), else the model's."""
    return 1 if kv_cache_dtype.startswith("fp8") else compute_bytes


def kv_heads_per_rank(kv_heads: int, tp_size: int) -> int:
    """KV heads one attention-TP rank stores: split when they divide, else one replicated head."""
    return kv_heads // tp_size if kv_heads >= tp_size else 1


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of every layer for one token, `kv_heads` being this rank's heads."""
    return 2 * num_layers * kv_heads * head_dim * dtype_bytes


def capture_sizes(sizes: list[int] | None, max_size: int | None, max_num_reqs: int) -> list[int]:
    """Decode batch sizes to capture, ascending: `sizes` as given, else the ladder 1, 2, 4, then every 8
    up to `max_size` (and `max_size` itself); none above what the scheduler runs at once."""
    if sizes:
        bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool) or s < 1]
        if bad:
            raise ValueError(f"--cudagraph-capture-sizes must be positive integers, got {bad}")
        chosen = sorted(set(sizes))
    else:
        top = DEFAULT_MAX_CAPTURE_SIZE if max_size is None else max_size
        if top < 1:
            raise ValueError(f"--max-cudagraph-capture-size must be >= 1, got {top}")
        chosen = sorted({s for s in [1, 2, 4, *range(8, top + 1, 8)] if s <= top} | {top})
    return [s for s in chosen if s <= max_num_reqs] or [min(chosen[0], max_num_reqs)]


def graph_capture_sizes(
    enforce_eager: bool,
    attention_backend: str,
    sizes: list[int] | None,
    max_size: int | None,
    max_num_reqs: int,
) -> list[int] | None:
    """Capture sizes of a GPU server, or None when it decodes eagerly (--enforce-eager, or the torch
    attention backend, which plans on the host every step)."""
    if enforce_eager or attention_backend == "torch":
        return None
    return capture_sizes(sizes, max_size, max_num_reqs)


def graph_reserve_bytes(hidden: int, intermediate: int, vocab: int, dtype_bytes: int, max_bs: int) -> int:
    """Bytes the graph pool takes: per token a decode step keeps a few hidden- and intermediate-size
    buffers alive plus float32 logits; the shared pool holds about two steps' worth at the largest size."""
    intermediate = intermediate or 4 * hidden
    per_token = (8 * hidden + 3 * intermediate) * dtype_bytes + 2 * vocab * 4
    return 2 * max_bs * per_token + GRAPH_POOL_SLACK_BYTES


def held_back_bytes(
    graph_sizes: list[int] | None,
    attention_backend: str,
    hidden: int,
    intermediate: int,
    vocab: int,
    dtype_bytes: int,
) -> int:
    """Bytes kept out of the KV budget while it is sized: the graph pool and FlashInfer's workspace."""
    graphs = (
        graph_reserve_bytes(hidden, intermediate, vocab, dtype_bytes, max(graph_sizes)) if graph_sizes else 0
    )
    return graphs + (FLASHINFER_WORKSPACE_BYTES if attention_backend == "flashinfer" else 0)


def rotary_table_bytes(max_model_len: int, head_dim: int) -> int:
    """The model's float32 cos|sin table, one row per position (built beside the weights)."""
    return max_model_len * 2 * head_dim * 4


def request_table_bytes(num_rows: int, max_context_len: int, block_size: int) -> int:
    """The request -> token slot table (int32, a row per running request, whole pages wide)."""
    return num_rows * -(-max_context_len // block_size) * block_size * 4


def free_after_load(free_bytes: int, weights_bytes: int, table_bytes: int) -> int:
    """The free memory a server will measure when it sizes its KV pool, predicted from the free memory
    before it starts."""
    return free_bytes - CUDA_CONTEXT_BYTES - weights_bytes - table_bytes


def kv_budget_bytes(free_bytes: int, total_bytes: int, utilization: float) -> int:
    """Bytes the KV pool may take out of `free_bytes`: what leaves `1 - utilization` of the total free."""
    return free_bytes - int(total_bytes * (1.0 - utilization))


def kv_tokens_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """Tokens of a pool of whole `block_size`-token pages within `budget_bytes` (0 when none fits)."""
    if budget_bytes <= 0:
        return 0
    return budget_bytes // (bytes_per_token * block_size) * block_size


@dataclass(frozen=True)
class GpuMemoryPlan:
    """One GPU's memory as a server will use it (bytes), and the KV tokens that leaves."""

    total: int
    free: int
    utilization: float
    weights: int
    request_table: int
    held_back: int
    kv_budget: int
    kv_tokens: int

    @property
    def reserve(self) -> int:
        """Everything but weights and KV that the budget accounts for."""
        return CUDA_CONTEXT_BYTES + self.request_table + self.held_back


def plan_gpu_memory(
    total: int,
    free: int,
    utilization: float,
    weights: int,
    request_table: int,
    held_back: int,
    kv_bytes_per_token_: int,
    block_size: int,
) -> GpuMemoryPlan:
    """The planner's prediction of what the server's `kv_sizing` will measure and decide."""
    budget = kv_budget_bytes(free_after_load(free, weights, request_table) - held_back, total, utilization)
    tokens = kv_tokens_for_budget(budget, kv_bytes_per_token_, block_size)
    return GpuMemoryPlan(total, free, utilization, weights, request_table, held_back, budget, tokens)
