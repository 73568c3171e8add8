"""Block sizes of the fused MoE kernels per decode batch size, per GPU: one table, read once per backend.

A row `(max_tokens, config)` applies to steps of at most `max_tokens` tokens (the first row that fits).
`gemv=True` takes the small-batch path (`moe_gemv.py`: routed rows only, no grouping); otherwise the
grouped tensor-core GEMMs (`moe_gemm.py`) with BLOCK_M rows per block. The gate/up kernel reads gate and
up columns into two accumulators, so its `block_n` covers 2 * block_n rows of `w13`.

The H200 rows were measured on the Qwen3-30B-A3B expert shape (128 experts, hidden 2048, intermediate
768, top-8) with `benchmarks/moe_tune.py`; other GPUs start from the same rows (a Hopper-class default)
until someone measures theirs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeKernelConfig:
    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    down_block_n: int = 64
    down_block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    gemv: bool = False
    gemv_block_n: int = 16
    gemv_block_k: int = 256
    gemv_down_block_n: int = 16
    gemv_down_block_k: int = 256
    gemv_warps: int = 4


_SMALL = MoeKernelConfig(gemv=True)
_HOPPER: tuple[tuple[int, MoeKernelConfig], ...] = (
    (4, _SMALL),
    (32, MoeKernelConfig(block_m=16, block_n=64, block_k=128, down_block_n=64, down_block_k=128)),
    (
        128,
        MoeKernelConfig(
            block_m=16, block_n=64, block_k=128, down_block_n=128, down_block_k=128, num_stages=3
        ),
    ),
    (
        512,
        MoeKernelConfig(
            block_m=32, block_n=64, block_k=128, down_block_n=128, down_block_k=128, num_stages=3
        ),
    ),
    (
        4096,
        MoeKernelConfig(block_m=64, block_n=64, block_k=64, down_block_n=128, down_block_k=64, num_stages=3),
    ),
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
