"""Block sizes of the fused MoE kernels per decode batch size, per GPU: one table, read once per backend.

A row `(max_tokens, config)` applies to steps of at most `max_tokens` tokens (the first row that fits).
The gate/up kernel reads gate and up columns into two accumulators, so its `block_n` covers 2 * block_n
rows of `w13`.

The H200 rows were measured on the Qwen3-30B-A3B expert shape (128 experts, hidden 2048, intermediate
768, top-8) with `benchmarks/moe_tune.py`; other GPUs start from the same rows (a Hopper-class default)
until someone measures theirs. Few-token steps take the CUDA-core GEMV (`gemv.py`) instead only where the
device's tuned table (`gemv_table.py`) says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeKernelConfig:
    # gate/up kernel: a tile of block_m routed rows by block_n gate (and block_n up) columns, K in block_k steps
    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    # down kernel: the same rows by down_block_n hidden columns, the intermediate size in down_block_k steps
    down_block_n: int = 64
    down_block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    # one routed pair per block and no grouping launch (the small-batch layout); else grouped by expert
    pairs: bool = False


# From benchmarks/moe_tune.py on the H200 (results/gpu_moe_tune.json): at 1 token the grouped m16n32k128
# layer took 30.7 us, m16n64k128 31.1 us, the CUDA-core GEMV path tried before it 38.8-84 us (limit 17.7);
# m16n64k128 was best or within 1% from 4 to 64 tokens, m32n64k128 best at 256 (87% of the limit).
_HOPPER: tuple[tuple[int, MoeKernelConfig], ...] = (
    (2, MoeKernelConfig(pairs=True, block_m=16, block_n=32, block_k=128, down_block_n=64, down_block_k=128)),
    (128, MoeKernelConfig(block_m=16, block_n=64, block_k=128, down_block_n=64, down_block_k=128)),
    (512, MoeKernelConfig(block_m=32, block_n=64, block_k=128, down_block_n=128, down_block_k=128)),
    (4096, MoeKernelConfig(block_m=64, block_n=64, block_k=64, down_block_n=128, down_block_k=64)),
    (
        1 << 62,
        MoeKernelConfig(
            block_m=128, block_n=64, block_k=64, down_block_n=128, down_block_k=64, num_warps=8, num_stages=3
        ),
    ),
)

TABLES: dict[str, tuple[tuple[int, MoeKernelConfig], ...]] = {"NVIDIA H200": _HOPPER, "default": _HOPPER}


def table_for(device_name: str) -> tuple[tuple[int, MoeKernelConfig], ...]:
    for name, table in TABLES.items():
        if name != "default" and name in device_name:
            return table
    return TABLES["default"]


def pick(table: tuple[tuple[int, MoeKernelConfig], ...], num_tokens: int) -> MoeKernelConfig:
    for max_tokens, cfg in table:
        if num_tokens <= max_tokens:
            return cfg
    return table[-1][1]
