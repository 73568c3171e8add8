"""Shared pieces of the GEMV benchmarks (`bf16_gemv.py`, `fp8_gemv.py`): the Llama-3.1-8B linear shapes,
their command line, one timed row per (shape, batch, path) and its printed line, and the results file.

A path is a list of calls, one per cold copy of the weight (`gpu_common.cold_copies`), timed as a CUDA
graph of CALLS calls cycling over them, as the engine replays decode.
"""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable

import torch

from benchmarks import gpu_common as gc

# Llama-3.1-8B's linear layers as [N, K] weights (the LM head: vocabulary x hidden)
LLAMA_8B_LINEARS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}
# Qwen3-30B-A3B's dense linear layers (its experts run in the fused MoE kernels): attention, router, LM head
QWEN3_MOE_LINEARS = {
    "qkv": (5120, 2048),
    "o": (2048, 4096),
    "router": (128, 2048),
    "lm_head": (151936, 2048),
}
PEAK = 4.8e12  # H200 HBM3e, datasheet
CALLS = 20


def bf16_weights(n: int, k: int) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """(cold copies of a random bf16 [n, k] weight, its float32 value for the reference, its bytes): what
    the bf16 benchmarks time their paths on."""
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    nbytes = 2 * n * k
    return gc.cold_copies(w.clone, nbytes), w.float(), nbytes


def time_path(row: dict, fns: list, ref: torch.Tensor, nbytes: int, tuned=None) -> dict:
    """Fill `row` with the path's relative error to `ref` and the time of one call, as weight bytes read
    per second and as a fraction of PEAK. `tuned`: the path's autotuned kernel, whose first call (the
    tuning) is timed and whose chosen config is recorded. A path that fails records its error instead,
    so it does not lose the other paths' figures."""
    try:
        t0 = time.perf_counter()
        err = float((fns[0]().float() - ref).norm() / ref.norm())  # also tunes the GEMV
        torch.cuda.synchronize()
        if tuned is not None:
            row["config"] = str(tuned.best_config)
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
        t = gc.graph_seconds([fns[i % len(fns)] for i in range(CALLS)])
        row.update(
            us=round(t * 1e6, 2), gb_s=round(nbytes / t / 1e9, 1), of_peak=round(nbytes / t / PEAK, 3),
            rel_err=float(f"{err:.3g}"),
        )  # fmt: skip
    except Exception as e:  # one failing path must not lose the others' figures
        traceback.print_exc()
        row["error"] = repr(e)[:500]
    return row


def row_figures(row: dict) -> str:
    """The printed figures of a row from `time_path`, or why it failed."""
    if "us" not in row:
        return f"FAILED {row['error']}"
    return (
        f"{row['us']:8.2f} us {row['gb_s']:7.1f} GB/s {row['of_peak']:.3f} of 4.8 TB/s "
        f"err {row['rel_err']:.2e} {row.get('config', '')}"
    )


def parse_args(
    doc: str, shapes: dict, default_m: list[int], out: str, argv: list[str] | None = None, models: tuple = ()
) -> argparse.Namespace:
    """--m (batch rows), --shapes (names from `shapes`, default all), --out (the results file, default `out`)
    and --table-out (where a script that derives a tuned table writes it); --model when `models` names more
    than one model (whose shapes the script then picks)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--m", nargs="+", type=int, default=default_m)
    ap.add_argument("--shapes", nargs="+", choices=list(shapes), default=None)
    if models:
        ap.add_argument("--model", choices=list(models), default=models[0])
    ap.add_argument("--out", default=out)
    ap.add_argument("--table-out", default=None)
    ap.add_argument("--table-base", default=None, help="an existing table whose other shapes --table-out keeps")
    ap.add_argument("--table-from", nargs="+", default=None, help="results files to derive --table-out from")
    return ap.parse_args(argv)


def run_shapes(
    bench_shape: Callable[[str, int, int, list[int]], list[dict]],
    shapes: dict,
    names: list[str],
    ms: list[int],
) -> tuple[float, list[dict]]:
    """(copy bandwidth, rows): a device-to-device copy's bandwidth measured first, then
    `bench_shape(name, n, k, ms)` of each name, every timed row also as a fraction of that bandwidth."""
    bw = gc.copy_bandwidth(1 << 30)
    print(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    rows = []
    for name in names:
        rows += bench_shape(name, *shapes[name], ms)
        torch.cuda.empty_cache()
    for r in rows:
        if "gb_s" in r:
            r["of_copy_bw"] = round(r["gb_s"] * 1e9 / bw, 3)
    return bw, rows


def against(rows: list[dict], base_path: str, path: str = "gemv") -> list[tuple[dict, dict]]:
    """(row of `path`, row of `base_path` at the same shape and batch) for each such pair both timed."""
    timed = {(r["shape"], r["m"], r["path"]): r for r in rows if "us" in r}
    return [
        (r, timed[(r["shape"], r["m"], base_path)])
        for r in rows
        if r["path"] == path and "us" in r and (r["shape"], r["m"], base_path) in timed
    ]


def save_results(path: str, benchmark: str, bw: float, **fields) -> None:
    """The results file: the device, the ceilings the rows are measured against, then `fields`."""
    gc.save_json(
        path,
        dict(
            benchmark=benchmark,
            device=gc.device_info(),
            peak_tb_s=PEAK / 1e12,
            copy_bandwidth_tb_s=round(bw / 1e12, 4),
            calls_per_graph=CALLS,
            **fields,
        ),
    )
