"""FP8 weight GEMV against today's FP8 path and bf16, on the Llama-3.1-8B linear shapes at decode batch sizes.

For each shape (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336) and M in 1, 4, 16:
- `gemv`: the Triton FP8 GEMV (`kernels/fp8_gemv.py`) as the engine runs it, with `default_config`,
  per-channel scales;
- `gemv_autotuned`: the same with the configuration `triton.autotune` times best at its first call: how
  much the fixed default gives away;
- `gemv_block128`: the default with 128x128 block scales (FP8 checkpoints), at M = 1 only;
- `scaled_mm`: the path before it, per-token activation quantization then `torch._scaled_mm`;
- `bf16`: `F.linear` on the bf16 weight.
Each is timed as a CUDA graph of 20 calls (the serving engine replays decode as graphs), the calls cycling
over enough copies of the weight (>= 256 MB in all) that none is served from the 50 MB L2 cache, as in a
real step, where the other layers' weights evict it. Reported: weight bytes read (scales included) per
second against the H200's 4.8 TB/s and against a device-to-device copy measured in the same run, and
each output's relative error to the float32 reference. Writes benchmarks/results/gpu_fp8_gemv.json.

    python benchmarks/fp8_gemv.py [--m 1 4 16] [--out PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gemv_timing as gt  # noqa: E402
from benchmarks import gpu_common as gc  # noqa: E402

SHAPES = {name: shape for name, shape in gt.LLAMA_8B_LINEARS.items() if name != "lm_head"}


def _gemv(x: torch.Tensor, wt: tuple[torch.Tensor, torch.Tensor], block: tuple[int, int] | None, tune=False):
    from tokenspeed.runtime.kernels import fp8_gemv

    if tune:
        return lambda: fp8_gemv.fp8_gemv(x, wt[0], wt[1], block, None, autotune=True)
    return lambda: fp8_gemv.fp8_gemv(x, wt[0], wt[1], block, None)


def _scaled_mm(x: torch.Tensor, wt: tuple[torch.Tensor, torch.Tensor]):
    """The FP8 path of decode batches before the GEMV: per-token activation quantization, then cuBLASLt."""
    from tokenspeed.runtime.layers.quantization.fp8_math import quantize_per_channel

    def call():
        q, xs = quantize_per_channel(x)
        return torch._scaled_mm(q, wt[0].t(), scale_a=xs, scale_b=wt[1].view(1, -1), out_dtype=x.dtype)

    return call


def _linear(x: torch.Tensor, w: torch.Tensor):
    return lambda: F.linear(x, w)


def bench_shape(name: str, n: int, k: int, ms: list[int]) -> list[dict]:
    from tokenspeed.runtime.kernels import fp8_gemv
    from tokenspeed.runtime.layers.quantization.fp8_math import (
        dequantize,
        quantize_block,
        quantize_per_channel,
    )

    w0 = torch.randn(n, k, device="cuda") * 0.02
    channel = quantize_per_channel(w0)
    block = quantize_block(w0, (128, 128))
    bf16 = w0.bfloat16()
    del w0
    # what each path multiplies by, in float32: its own error is then the kernel's, not the format's
    dense = {
        "channel": dequantize(*channel, None, torch.float32),
        "block": dequantize(*block, (128, 128), torch.float32),
        "bf16": bf16.float(),
    }
    fp8_bytes = n * k + channel[1].numel() * 4
    block_bytes = n * k + block[1].numel() * 4
    ch_w = gc.cold_copies(lambda: tuple(t.clone() for t in channel), fp8_bytes)
    bl_w = gc.cold_copies(lambda: tuple(t.clone() for t in block), block_bytes)
    bf_w = gc.cold_copies(bf16.clone, 2 * n * k)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = {kind: F.linear(x.float(), d) for kind, d in dense.items()}

        paths = {
            "gemv": ([_gemv(x, w, None) for w in ch_w], fp8_bytes, "channel"),
            "gemv_autotuned": ([_gemv(x, w, None, tune=True) for w in ch_w], fp8_bytes, "channel"),
            "scaled_mm": ([_scaled_mm(x, w) for w in ch_w], fp8_bytes, "channel"),
            "bf16": ([_linear(x, w) for w in bf_w], 2 * n * k, "bf16"),
        }
        if m == 1:
            paths["gemv_block128"] = ([_gemv(x, w, (128, 128)) for w in bl_w], block_bytes, "block")
        for path, (fns, nbytes, kind) in paths.items():
            row = dict(shape=name, n=n, k=k, m=m, path=path, weight_mb=round(nbytes / 1e6, 2))
            if path == "gemv_autotuned":
                rows.append(gt.time_path(row, fns, ref[kind], nbytes, fp8_gemv._tuned))
            else:
                if path.startswith("gemv"):  # the configuration the engine runs
                    bk = 128 if path == "gemv_block128" else None
                    row["config"] = str(fp8_gemv.default_config(fp8_gemv.m_bucket(m), n, k, bk))
                rows.append(gt.time_path(row, fns, ref[kind], nbytes))
            print(f"{name:8s} {n:6d}x{k:<6d} m={m:2d} {path:14s} {gt.row_figures(row)}", flush=True)
    return rows


def main() -> None:
    args = gt.parse_args(__doc__, SHAPES, [1, 4, 16], str(ROOT / "benchmarks/results/gpu_fp8_gemv.json"))
    start = time.perf_counter()
    bw, rows = gt.run_shapes(bench_shape, SHAPES, args.shapes or list(SHAPES), args.m)
    speedup = {
        f"{r['shape']}/m{r['m']}": round(b["us"] / r["us"], 2) for r, b in gt.against(rows, "scaled_mm")
    }
    print("gemv speedup over scaled_mm: " + ", ".join(f"{k}={v}" for k, v in speedup.items()))
    seconds = round(time.perf_counter() - start, 1)
    gt.save_results(args.out, "fp8_gemv", bw, gemv_speedup_over_scaled_mm=speedup, seconds=seconds, rows=rows)


if __name__ == "__main__":
    main()
