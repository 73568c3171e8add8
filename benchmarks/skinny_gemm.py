"""The skinny tensor-core GEMM (`kernels/skinny_gemm.py`) against cuBLAS on a model's linear shapes at decode
batches of 8-128 rows: does it read the weights faster than cuBLAS where a decode step's GEMMs run?

For each shape (the Llama-3.1-8B's qkv, o, gate_up and down, or Qwen3-30B-A3B's qkv and o with `--model
qwen3moe`) and batch M, every configuration `skinny_gemm.candidates` lists is timed, and the fastest is
compared with `F.linear` (cuBLAS, what the engine runs at these batches now). Each is timed as a CUDA graph
of 20 calls cycling over enough copies of the weight that none is served from the L2 cache
(`gemv_timing.time_path`), as the engine replays decode; a configuration whose output is more than 1% off
the float32 reference, or that cannot launch, is reported and skipped. Also reported: a decode step's
GEMMs at each batch, each shape taken by the faster path (`step`), against cuBLAS alone.

`--table-out PATH` writes the dense GEMV's tuned table (`kernels/gemv_table.py`) with a 'skinny' entry per
shape and batch where the skinny GEMM beat cuBLAS by 3%, keeping the rest of `--table-base` (the shipped
`tokenspeed/runtime/kernels/tuned/<GPU>.json`): with it, `--dense-gemv-backend auto` runs the skinny GEMM
at those batches. None ships yet: nothing in the engine calls the kernel until a run here shows a win.

    python benchmarks/skinny_gemm.py [--model llama8b|qwen3moe] [--m 16 64] [--shapes ...] [--out PATH]
        [--table-out PATH --table-base tokenspeed/runtime/kernels/tuned/NVIDIA_H200.json]
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gemv_timing as gt  # noqa: E402

# per model: the linear shapes its decode step runs as GEMMs at these batches, and its layers
MODELS = {
    "llama8b": ({n: s for n, s in gt.LLAMA_8B_LINEARS.items() if n != "lm_head"}, 32),
    "qwen3moe": ({n: gt.QWEN3_MOE_LINEARS[n] for n in ("qkv", "o")}, 48),
}


def _config_text(cfg) -> str:
    return (
        f"{'swap ' if cfg.swap_ab else ''}m{cfg.block_m} n{cfg.block_n} k{cfg.block_k} split{cfg.split_k} "
        f"w{cfg.num_warps} s{cfg.num_stages}"
    )


def bench_shape(name: str, n: int, k: int, ms: list[int]) -> list[dict]:
    from tokenspeed.runtime.kernels import skinny_gemm as sg

    ws, wf, nbytes = gt.bf16_weights(n, k)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), wf)
        base = dict(shape=name, n=n, k=k, m=m, weight_mb=round(nbytes / 1e6, 2))
        cublas = gt.time_path(
            dict(base, path="cublas"), [lambda w=w, x=x: F.linear(x, w) for w in ws], ref, nbytes
        )
        print(f"{name:8s} {n:6d}x{k:<6d} m={m:<3d} cublas {gt.row_figures(cublas)}", flush=True)
        timed = []
        for cfg in sg.candidates(m, n, k, num_sms):
            arrivals = torch.zeros(sg.tiles(m, n, cfg), device="cuda", dtype=torch.int32)
            fns = [lambda w=w, x=x, c=cfg, a=arrivals: sg.skinny_gemm(x, w, c, a) for w in ws]
            row = gt.time_path(dict(base, path="skinny", config=_config_text(cfg)), fns, ref, nbytes)
            row["skinny_config"] = dataclasses.asdict(cfg)
            if "us" in row and row["rel_err"] > 1e-2:
                row = dict(
                    base, path="skinny", config=row["config"], error=f"relative error {row['rel_err']}"
                )
            if "us" in row:
                timed.append(row)
            else:
                print(f"    {_config_text(cfg)}: skipped ({row['error'][:160]})")
        timed.sort(key=lambda r: r["us"])
        if timed:
            best = dict(timed[0], candidates=[{"config": r["config"], "us": r["us"]} for r in timed])
            rows.append(best)
            print(
                f"{name:8s} {n:6d}x{k:<6d} m={m:<3d} skinny {gt.row_figures(best)} ({len(timed)} timed)",
                flush=True,
            )
        rows.append(cublas)
    del wf, ws
    return rows


def step(rows: list[dict], m: int, shapes: dict, layers: int) -> dict[str, dict]:
    """A decode step's GEMMs at batch m (each shape once a layer): cuBLAS alone, and each shape's faster path
    (what a tuned table would choose); empty unless cuBLAS was timed at every shape."""
    got = {(r["shape"], r["path"]): r for r in rows if r["m"] == m and "us" in r}
    if not all((s, "cublas") in got for s in shapes):
        return {}
    cublas = {s: got[(s, "cublas")] for s in shapes}
    faster = {s: min((got[(s, p)] for p in ("skinny", "cublas") if (s, p) in got), key=_us) for s in shapes}
    out = {}
    for label, chosen in (("cublas", cublas), ("faster", faster)):
        us = sum(r["us"] for r in chosen.values()) * layers
        nbytes = sum(r["weight_mb"] for r in chosen.values()) * 1e6 * layers
        out[label] = dict(ms=round(us / 1e3, 3), tb_s=round(nbytes / us / 1e6, 3))
    out["faster"]["skinny_shapes"] = sorted(s for s, r in faster.items() if r["path"] == "skinny")
    return out


def _us(row: dict) -> float:
    return row["us"]


def skinny_entries(rows: list[dict], margin: float = 0.03) -> dict[str, dict[str, dict]]:
    """The tuned table's 'skinny' object (`kernels/gemv_table.py`): per shape key and batch rows timed, the
    fastest configuration where it beat cuBLAS by `margin`."""
    from tokenspeed.runtime.kernels.gemv_table import shape_key

    out: dict[str, dict[str, dict]] = {}
    for r, base in gt.against(rows, "cublas", path="skinny"):
        if base["us"] / r["us"] >= 1 + margin:
            out.setdefault(shape_key(r["n"], r["k"], "bfloat16"), {})[str(r["m"])] = r["skinny_config"]
    return out


def write_table(path: str, device_name: str, skinny: dict, base: str | None) -> None:
    """The tuned table with this run's 'skinny' entries: `base`'s shapes and GEMV configurations kept, its
    skinny entries for the shapes this run timed replaced."""
    import json

    from tokenspeed.bench_results import provenance
    from tokenspeed.runtime.kernels.gemv_table import load_table, to_json

    old = json.loads(Path(base).read_text()) if base else {}
    merged = {**old.get("skinny", {}), **skinny}
    data = to_json(device_name, old.get("shapes", {}), provenance(), old.get("configs"), merged)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    load_table(path)  # what the server will read
    print(f"wrote {path}: the skinny GEMM takes {sorted((k, sorted(v)) for k, v in merged.items())}")


def main() -> None:
    names = dict.fromkeys(n for shapes, _ in MODELS.values() for n in shapes)
    args = gt.parse_args(
        __doc__, names, [16, 64], str(ROOT / "benchmarks/results/gpu_skinny_gemm.json"), models=tuple(MODELS)
    )
    shapes, layers = MODELS[args.model]
    start = time.perf_counter()
    bw, rows = gt.run_shapes(bench_shape, shapes, [s for s in (args.shapes or shapes) if s in shapes], args.m)
    against = gt.against(rows, "cublas", path="skinny")
    speedup = {f"{r['shape']}/m{r['m']}": round(base["us"] / r["us"], 3) for r, base in against}
    print(f"skinny speed-up over cuBLAS: {speedup}")
    steps = {f"m{m}": step(rows, m, shapes, layers) for m in args.m}
    print(f"decode-step GEMMs: {steps}")
    if args.table_out:
        write_table(args.table_out, torch.cuda.get_device_name(0), skinny_entries(rows), args.table_base)
    seconds = round(time.perf_counter() - start, 1)
    print(f"total {seconds} s")
    gt.save_results(
        args.out, "skinny_gemm", bw, model=args.model, speedup_over_cublas=speedup, step=steps,
        seconds=seconds, rows=rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
