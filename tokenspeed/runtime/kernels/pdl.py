"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's short kernels.

At batch 1 a decode step is a few hundred kernels of a few microseconds each, and a kernel normally
starts only after the one before it has finished and its writes are flushed. A kernel launched with PDL
may start while its predecessor is still running: it loads what no kernel writes (a GEMV's first weight
chunks), then waits for the predecessor before it reads the activations. On the H200 a CUDA graph of 96
Llama-3.1-8B-shaped GEMVs ran 1.034x faster with it (0.915 -> 0.946 of the copy bandwidth, bit-equal
outputs; `benchmarks/pdl_probe.py`, `benchmarks/results/gpu_pdl_probe.json`).

The contract of every kernel launched with `launch_kwargs(device)`:
- it calls `wait(PDL)` before it reads anything an earlier kernel wrote and before it writes anything
  (`griddepcontrol.wait` returns once every kernel it depends on has completed and its writes are
  visible, so what a PDL kernel sees is what it would see without PDL);
- it calls `release(PDL)` once it no longer needs its multiprocessors' slots to itself: the next PDL
  kernel may then be scheduled and start its own loads (a kernel that never calls it releases at exit).
A kernel launched without PDL waits for everything before it, as always; one launched with it but
without the wait would race, so only kernels that call `wait` take these keyword arguments: the dense
and FP8 GEMVs (`bf16_gemv.py`, `fp8_gemv.py`, which load their first weight chunks before it), RMSNorm
and SiLU-and-mul (`fused_ops.py`), RoPE with the K/V write (`rope_store.py`), decode attention's two
stages (`decode_attention.py`), and the MoE layer's routing, grouped GEMMs and pair sum
(`moe/kernels/routing.py`, `gemm.py`).

PDL is on for every GPU of compute capability 9 or later; `TOKENSPEED_PDL=0` turns it off. Whole decode steps
with and without it, the two sets of CUDA graphs of one engine replayed in turns (`benchmarks/decode_ab.py`,
H200, 2026-12-05, `benchmarks/results/gpu_decode_ab_llama8b.json`, `gpu_decode_ab_qwen3moe.json`): the 8B
shape at batch 1 4.524 -> 4.403 ms (1.028x), Qwen3-30B-A3B at batch 1 3.139 -> 3.082 ms (1.019x) and at 64
17.984 -> 17.911 ms (1.004x), the 8B at 64 unchanged (7.136 against 7.141 ms), the logits bit-equal in
every case. The CPU interpreter and GPUs before Hopper never use it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

ENV = "TOKENSPEED_PDL"


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a CUDA GPU of compute capability 9 or later, unless
    TOKENSPEED_PDL=0."""
    if device.type != "cuda" or os.environ.get(ENV, "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_kwargs(device: torch.device) -> dict[str, bool]:
    """The constexpr `PDL` and Triton's `launch_pdl` option for a launch on `device`. Without PDL the
    option is left out, so a Triton (or its interpreter) that lacks it never sees it."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@triton.jit
def wait(PDL: tl.constexpr):
    """Block until the kernels this one depends on have completed and their writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release(PDL: tl.constexpr):
    """Let the next kernel launched with PDL be scheduled now."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
