"""The decode kernels compiled for Hopper (sm_90) on a machine without a GPU, and what each costs an SM.

Triton compiles to sm_90 machine code with the ptxas it ships, no GPU needed. Read back with the
cuobjdump it also ships, a kernel's registers a thread and shared memory say how many of its programs
fit on one H200 multiprocessor at once. That number decides whether a grid runs in one wave or leaves
a second one partly empty: the FP8 KV cache's decode attention took 152 registers a thread with three
stages under Triton 3.6, three programs an SM where the split rule planned four, and its batch-64 step got
10% slower (kernels/decode_attention.py). Run this with the Triton the GPU machine has
(tests/gpu/image_packages.txt: 3.6) before spending device time on a launch configuration:

    pip install --target /tmp/t36 --no-deps triton==3.6.0
    PYTHONPATH=/tmp/t36 python3 tools/sm90_kernels.py

It prints, for the configurations the engine picks (decode attention per shape, batch and cache dtype;
the fused MoE kernels at the H200 table's one-token configuration; the dense GEMV's shipped table at one
row): registers, spilled bytes, shared memory and programs an SM. tests/engine/test_triton_compiles_for_hopper.py
compiles with `compile_sm90` too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton

ROOT = Path(__file__).resolve().parents[1]

REGISTERS_PER_SM = 65536
SHARED_PER_SM = 228 * 1024  # an H200 multiprocessor's shared memory, 1 KB of it reserved per program
MAX_PROGRAMS_PER_SM = 32
INDEX = {n: "*i32" for n in ("req_to_token", "req_pool_indices", "seq_lens", "extend_lens", "qo_start")}


def compile_sm90(
    fn,
    types: dict[str, str],
    constants: dict[str, object],
    num_warps: int,
    num_stages: int,
    aligned: bool = False,
    **options,
):
    """`fn` compiled to sm_90: pointer and scalar arguments typed from `types` (by name; int32 when unnamed),
    constexpr ones from `constants`; `options` go to the compiler as they are (`launch_pdl`). `aligned`
    marks every pointer and stride divisible by 16, as Triton specializes them at a real launch: the
    vectorized, pipelined code a GPU runs, whose registers `resources` reads."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    unknown = set(constants) - set(names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no parameter {sorted(unknown)}")
    # constexpr parameters left out take their defaults, as at a launch (typed as int32 instead, a
    # feature flag such as ROUTE would compile its branch as a runtime one)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constants = {**{n: v for n, v in defaults.items() if n not in constants}, **constants}
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
    consts = {(names.index(n),): v for n, v in constants.items()}
    attrs = {}
    if aligned:
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if signature[n].startswith("*") or (n.startswith("stride") and signature[n] == "i32")}  # fmt: skip
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    kernel = triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages, **options},
    )
    if not kernel.asm.get("cubin"):
        raise RuntimeError(f"{fn.__name__}: ptxas produced no sm_90 code")
    return kernel


@dataclass(frozen=True)
class Resources:
    registers: int  # a thread's
    stack: int  # bytes a thread spills
    shared: int  # bytes a program
    per_sm: int  # programs of this kernel resident on one multiprocessor at once


def resources(kernel, num_warps: int) -> Resources:
    """What the compiled kernel takes of a multiprocessor (cuobjdump -res-usage on its cubin)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True)
    regs = int(re.search(r"REG:(\d+)", usage.stdout).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage.stdout).group(1))
    shared = kernel.metadata.shared
    by_regs = REGISTERS_PER_SM // (-(-regs // 8) * 8 * 32 * num_warps)  # allocated in steps of 8 a thread
    by_shared = SHARED_PER_SM // (shared + 1024)
    return Resources(regs, stack, shared, min(by_regs, by_shared, MAX_PROGRAMS_PER_SM))


def decode_attention_rows() -> list[tuple[str, Resources, int]]:
    """(what, resources, programs a grid has / SMs) for stage 1 at the configuration the engine picks."""
    from tokenspeed.runtime.kernels.decode_attention import (
        _decode_stage1_kernel,
        decode_launch,
        decode_num_splits,
    )

    rows, sms = [], 132
    for model, kv_heads in (("llama8b", 8), ("qwen3moe", 4)):
        for cache, kv_bytes in (("*bf16", 2), ("*fp8e4nv", 1)):
            for bs in (1, 16, 64, 256):
                splits = decode_num_splits(bs, kv_heads, sms)
                programs = bs * kv_heads * splits
                launch = decode_launch(128, False, programs, sms, kv_bytes)
                types = {"Q": "*bf16", "K_buf": cache, "V_buf": cache, "Mid_O": "*fp32", "Mid_lse": "*fp32",
                         "Out": "*bf16", "Arrivals": "*i32", "sm_scale": "fp32", **INDEX}  # fmt: skip
                constants = dict(KV_GROUP=32 // kv_heads, HEAD_DIM=128, NUM_SPLITS=splits, BLOCK_H=16,
                                 BLOCK_N=launch.block_n, BLOCK_D=128, IEEE=False, FP32_PV=False)  # fmt: skip
                kernel = compile_sm90(_decode_stage1_kernel, types, constants, launch.num_warps, launch.num_stages,
                                      aligned=True)  # fmt: skip
                what = (f"decode attention {model} {cache[1:]} bs {bs}: {splits} splits, {launch.block_n} keys, "
                        f"{launch.num_stages} stages")  # fmt: skip
                rows.append((what, resources(kernel, launch.num_warps), -(-programs // sms)))
    return rows


def moe_rows() -> list[tuple[str, Resources, int]]:
    """The fused MoE's gate|up and down GEMMs at the H200 table's one-token configuration, on Qwen3-30B-A3B's
    shape: 8 routed pairs, intermediate 768, hidden 2048 (the grids below)."""
    from tokenspeed.runtime.moe.kernels import gemm
    from tokenspeed.runtime.moe.kernels.configs import pick, table_for

    cfg = pick(table_for("NVIDIA H200"), 1)
    tile = dict(IEEE=False, EVEN_K=True, PAIRS=cfg.pairs, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k)
    types = {"X": "*bf16", "W": "*bf16", "Act": "*bf16", "Sorted": "*i32", "BlockExpert": "*i32", "S": "*bf16",
             "Out": "*fp32", "Weights": "*fp32"}  # fmt: skip
    gate_up = compile_sm90(gemm._gate_up_silu_kernel, types, dict(tile, BLOCK_N=cfg.block_n, TOP_K=8),
                           cfg.num_warps, cfg.num_stages, aligned=True)  # fmt: skip
    down_tile = dict(tile, BLOCK_N=cfg.down_block_n, BLOCK_K=cfg.down_block_k)
    down = compile_sm90(gemm._down_kernel, types, down_tile, cfg.num_warps, cfg.num_stages, aligned=True)
    sms = 132
    return [
        (f"moe gate|up, 1 token: {cfg.block_n} columns", resources(gate_up, cfg.num_warps), -(-8 * 768 // cfg.block_n // sms)),
        (f"moe down, 1 token: {cfg.down_block_n} columns", resources(down, cfg.num_warps), -(-8 * 2048 // cfg.down_block_n // sms)),
    ]  # fmt: skip


def dense_gemv_rows() -> list[tuple[str, Resources, int]]:
    """The dense GEMV at one row, each configuration the H200's shipped table gives."""
    from tokenspeed.runtime.kernels import gemv_table
    from tokenspeed.runtime.kernels.bf16_gemv import _dense_gemv_kernel

    rows = []
    types = {"X": "*bf16", "W": "*bf16", "Bias": "*bf16", "Out": "*bf16", "Part": "*fp32", "Arrivals": "*i32"}
    for key, buckets in sorted(gemv_table.table_for_device("NVIDIA H200").configs.items()):
        cfg = buckets.get(1)
        if cfg is None:
            continue
        constants = dict(HAS_BIAS=False, BLOCK_M=1, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                         SPLIT_K=cfg["SPLIT_K"], PREFETCH=cfg["PREFETCH"], EVEN_K=True, EVEN_N=True)  # fmt: skip
        kernel = compile_sm90(
            _dense_gemv_kernel, types, constants, cfg["num_warps"], cfg["num_stages"], aligned=True
        )
        n = int(re.match(r"N=(\d+)", key).group(1))
        waves = -(-(n // cfg["BLOCK_N"]) * cfg["SPLIT_K"] // 132)
        rows.append(
            (
                f"dense gemv {key}: {cfg['BLOCK_N']}x{cfg['BLOCK_K']}",
                resources(kernel, cfg["num_warps"]),
                waves,
            )
        )
    return rows


def main() -> int:
    print(f"triton {triton.__version__}: sm_90 registers a thread, spilled bytes, shared memory, programs an SM;"
          " last: programs a grid has per SM")  # fmt: skip
    for what, r, per_sm_needed in decode_attention_rows() + moe_rows() + dense_gemv_rows():
        flag = "  <- a second wave" if r.per_sm < per_sm_needed <= 2 * r.per_sm else ""
        print(f"{what:70s} regs {r.registers:3d} stack {r.stack:3d} smem {r.shared:6d} -> {r.per_sm:2d}/SM,"
              f" grid {per_sm_needed}/SM{flag}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
