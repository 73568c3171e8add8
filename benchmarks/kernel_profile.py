"""What one decode step launches: kernel count and where the GPU time goes, read with torch.profiler.

The step is profiled eagerly (`runner.run(fb, use_graphs=False)`): a CUDA graph replays exactly the
kernels of the eager forward it captured, so the count is the graph's, and the per-kernel durations are
the kernels' own (launch gaps excluded). Kernels are grouped by what they do, so a table of a few rows
says whether a step is bound by its matrix products or by everything around them.
"""

from __future__ import annotations

import collections
from typing import Any

import torch

# (group, substrings of the kernel name that place it there), first match wins
GROUPS = [
    # a MoE layer's routed experts: routing, alignment, the grouped GEMMs or the GEMV, the pair sum
    ("experts", ("gate_up", "_down_kernel", "sum_pairs", "_route_kernel", "_align_kernel", "fused_moe")),
    ("rope+kv write", ("rope_store",)),
    ("rope", ("rope",)),
    ("kv write", ("store_kv",)),
    ("rmsnorm", ("rmsnorm",)),
    ("silu*mul", ("silu_mul",)),
    (
        "attention",
        ("decode", "extend", "attn", "attention", "prefill", "merge", "flashinfer", "page_indices"),
    ),
    ("matmul", ("gemm", "gemv", "cutlass", "sm90", "nvjet", "xmma", "cublas", "splitk", "matmul", "fp8",
                "quantize")),
    ("sampling", ("argmax", "reduce", "softmax", "sampl")),
]


def _group(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def profile_step(step, warmup: int = 2) -> dict[str, Any]:
    """Kernels launched by one call of `step()`: count, summed device time, and per-group totals."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = []
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name
        if name.startswith(("Memcpy", "Memset")) or "memcpy" in name.lower():
            continue
        kernels.append((name, evt.time_range.elapsed_us()))  # a device event's span is its kernel's time
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for name, us in kernels:
        g = groups[_group(name)]
        g[0] += 1
        g[1] += us
    total_us = sum(us for _, us in kernels)
    return {
        "kernels": len(kernels),
        "kernel_time_ms": round(total_us / 1e3, 4),
        "groups": {
            g: {"kernels": n, "ms": round(us / 1e3, 4), "share": round(us / total_us, 4) if total_us else 0.0}
            for g, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])
        },
    }


def fused_and_unfused(runner, fb) -> dict[str, Any]:
    """The eager decode step's kernels with the fused RoPE + KV write, and with it turned off (rotary and
    K/V store as two launches per layer, the path before the fusion), on the same batch."""
    backend = runner.attn_backend

    def step():
        torch.argmax(runner.run(fb, use_graphs=False), dim=-1)

    with torch.inference_mode():
        fused = profile_step(step)
        had = "supports_fused_rope_store" in vars(backend)
        old = getattr(backend, "supports_fused_rope_store", False)
        backend.supports_fused_rope_store = False
        try:
            unfused = profile_step(step)
        finally:
            if had:
                backend.supports_fused_rope_store = old
            else:
                del backend.supports_fused_rope_store
    return {"fused": fused, "unfused": unfused}


def describe(label: str, prof: dict[str, Any]) -> str:
    parts = ", ".join(f"{g} {v['kernels']}k/{v['ms']:.3f}ms" for g, v in prof["groups"].items())
    return f"{label}: {prof['kernels']} kernels, {prof['kernel_time_ms']:.3f} ms of kernel time ({parts})"
