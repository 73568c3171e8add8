"""Does programmatic dependent launch (PDL, Hopper) shorten a chain of decode-sized GEMVs?

At batch 1 a decode step is hundreds of short kernels, each reading its weight once; the small ones (o, qkv)
read at only 2.5-2.8 TB/s on the H200, because a kernel's first loads wait for the previous kernel to
finish and its last wave leaves SMs idle. With PDL a kernel may start while its predecessor is still
running: it loads its first weight chunks (weights do not depend on the predecessor), then waits
(`griddepcontrol.wait`) before it reads the activations the predecessor wrote.

This measures that on its own, before any production kernel takes it: a chain of GEMVs shaped like
Llama-3.1-8B's o (4096 x 4096), up (14336 x 4096) and down (4096 x 14336), each reading the previous one's
output, 32 times over (8.5 GB of distinct weights, so the L2 holds none), replayed from one CUDA graph, with
and without PDL. The two variants compute the same sums in the same order; the script checks the outputs
are equal to the bit. Prints the chain's time, its bandwidth against the copy bandwidth of the same run,
and writes benchmarks/results/gpu_pdl_probe.json.

    python benchmarks/pdl_probe.py [--layers 32] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K): o, up, down; N of one is K of the next
BLOCK_N, BLOCK_K, WARPS = 4, 1024, 4


@triton.jit
def _gemv_kernel(X, W, Y, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """y[n] = sum_k x[k] * w[n, k] for BLOCK_N rows, K in BLOCK_K chunks (K a multiple of BLOCK_K), loading
    the next weight chunk before multiplying this one. With PDL the first chunk is loaded before waiting
    for the predecessor, and dependents may launch at once."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    rows = W + offs_n[:, None].to(tl.int64) * stride_wn
    w_next = tl.load(rows + offs_k[None, :], mask=nmask[:, None], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # X is the predecessor's output
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    chunks = K // BLOCK_K
    for i in range(chunks):
        w = w_next
        nxt = tl.minimum(i + 1, chunks - 1) * BLOCK_K + offs_k
        w_next = tl.load(rows + nxt[None, :], mask=nmask[:, None], other=0.0)
        x = tl.load(X + i * BLOCK_K + offs_k)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(Y + offs_n, tl.sum(acc, 1).to(Y.dtype.element_ty), mask=nmask)


def chain(weights: list[torch.Tensor], x: torch.Tensor, outs: list[torch.Tensor], pdl: bool) -> None:
    for w, y in zip(weights, outs, strict=True):
        n, k = w.shape
        _gemv_kernel[(triton.cdiv(n, BLOCK_N),)](
            x, w, y, n, k, w.stride(0), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PDL=pdl, num_warps=WARPS, num_stages=1,
            launch_pdl=pdl,
        )  # fmt: skip
        x = y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_pdl_probe.json"))
    args = ap.parse_args()

    bw = gc.copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = SHAPES * args.layers
    weights = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k**-0.5 for n, k in shapes
    ]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    x = torch.randn(shapes[0][1], device="cuda", dtype=torch.bfloat16, generator=gen)
    results, final = {}, {}
    for pdl in (False, True):
        outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for n, _ in shapes]
        seconds = gc.graph_seconds([lambda o=outs, p=pdl: chain(weights, x, o, p)])
        final[pdl] = outs[-1].clone()
        results["pdl" if pdl else "plain"] = dict(
            ms=round(seconds * 1e3, 4), tb_s=round(nbytes / seconds / 1e12, 3), ratio=round(nbytes / bw / seconds, 4)
        )  # fmt: skip
        print(f"{'pdl' if pdl else 'plain':5s}: {len(shapes)} GEMVs, {nbytes / 1e9:.2f} GB in {seconds * 1e3:.3f} ms "
              f"= {nbytes / seconds / 1e12:.2f} TB/s ({nbytes / bw / seconds:.3f} of the copy bandwidth)", flush=True)  # fmt: skip
    same = bool(torch.equal(final[False], final[True]))
    speedup = results["plain"]["ms"] / results["pdl"]["ms"]
    print(f"outputs equal: {same}; PDL {speedup:.3f}x; copy bandwidth {bw / 1e12:.2f} TB/s")
    gc.save_run(args.out, "pdl_probe", "Llama-3.1-8B o/up/down GEMV chain", copy_bandwidth_tb_s=round(bw / 1e12, 3),
                layers=args.layers, kernels=len(shapes), weight_gb=round(nbytes / 1e9, 3), outputs_equal=same,
                pdl_speedup=round(speedup, 4), **results)  # fmt: skip


if __name__ == "__main__":
    main()
