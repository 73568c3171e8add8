"""Dense bf16 GEMV against cuBLAS on a model's linear shapes at decode batches of 1, 2 and 4 rows.

For each shape (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336, lm_head 128256x4096) and M:
- `gemv`: the Triton GEMV (`kernels/bf16_gemv.py`, autotuned at its first call, which is timed);
- `cublas`: `F.linear` (cuBLAS), what `--dense-gemv-backend torch` runs.
The LM head is timed as the model calls it: float32 logits (the GEMV writes them from its accumulators;
cuBLAS's bf16 output is cast). Each path is timed as a CUDA graph of 20 calls (the engine replays decode as
graphs), the calls cycling over enough copies of the weight (>= 256 MB) that none is served from the L2
cache. Reported: weight bytes read per second, as a fraction of the H200's 4.8 TB/s and of a
device-to-device copy measured in the same run (bytes read + written), each output's relative error to
the float32 reference, and a batch-1 step estimate (each layer's linears plus the LM head).
`--model qwen3moe` times Qwen3-30B-A3B's dense linears instead (qkv 5120x2048, o 2048x4096, the router
128x2048, lm_head 151936x2048; 48 layers): at one token its attention and router are small products,
where a launch and a partly filled GPU cost the most.

    python benchmarks/bf16_gemv.py [--model llama8b|qwen3moe] [--m 1 2 4] [--shapes ...] [--out PATH]
                                   [--table-out PATH [--table-base PATH | --table-from RESULTS...]]

`--table-out` writes the tuned table `--dense-gemv-backend auto` reads (kernels/gemv_table.py): per shape, the
GEMV up to the largest batch where it beat cuBLAS by 3% without losing at a smaller one, and the launch
configuration that won each of those batches; `--table-base` keeps the shapes of an existing table (the
other model's) that this run did not time. `--table-from RESULTS...` derives the table from earlier runs'
results files instead of timing anything (no GPU): `python benchmarks/bf16_gemv.py --table-from
benchmarks/results/gpu_bf16_gemv.json benchmarks/results/gpu_bf16_gemv_qwen3moe.json --table-out
tokenspeed/runtime/kernels/tuned/NVIDIA_H200.json` writes the shipped H200 table.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gemv_timing as gt  # noqa: E402

# per model: its [N, K] linear shapes and its layers (each shape once per layer, the LM head once per step)
MODELS = {"llama8b": (gt.LLAMA_8B_LINEARS, 32), "qwen3moe": (gt.QWEN3_MOE_LINEARS, 48)}


def _paths(name: str, x: torch.Tensor, ws: list[torch.Tensor]) -> dict[str, list]:
    from tokenspeed.runtime.kernels.bf16_gemv import arrival_tiles, dense_gemv

    # the split-K arrival counts, kept as the engine keeps them (none allocated inside a timed call)
    need = arrival_tiles(ws[0].shape[0], x.device)
    r = torch.zeros(max(need, 1), dtype=torch.int32, device=x.device) if need else None
    if name == "lm_head":
        return {
            "gemv": [lambda w=w: dense_gemv(x, w, None, torch.float32, arrivals=r) for w in ws],
            "cublas": [lambda w=w: F.linear(x, w).float() for w in ws],
        }
    return {
        "gemv": [lambda w=w: dense_gemv(x, w, arrivals=r) for w in ws],
        "cublas": [lambda w=w: F.linear(x, w) for w in ws],
    }


def bench_shape(name: str, n: int, k: int, ms: list[int]) -> list[dict]:
    from tokenspeed.runtime.kernels import bf16_gemv

    ws, wf, nbytes = gt.bf16_weights(n, k)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), wf)
        for path, fns in _paths(name, x, ws).items():
            row = dict(shape=name, n=n, k=k, m=m, path=path, weight_mb=round(nbytes / 1e6, 2))
            rows.append(gt.time_path(row, fns, ref, nbytes, bf16_gemv._tuned if path == "gemv" else None))
            print(f"{name:8s} {n:6d}x{k:<6d} m={m} {path:6s} {gt.row_figures(row)}", flush=True)
    del wf, ws
    return rows


def step_estimate(rows: list[dict], m: int, shapes: dict, layers: int) -> dict[str, dict]:
    """A decode step's linear layers at batch m, per path: `layers` x each shape + the LM head once.
    `faster` takes each shape's faster path: what a per-shape choice of the backend would reach."""
    count = {s: (1 if s == "lm_head" else layers) for s in shapes}
    by_path = {}
    for path in ("gemv", "cublas"):
        got = {r["shape"]: r for r in rows if r["m"] == m and r["path"] == path and "us" in r}
        if set(got) == set(shapes):
            by_path[path] = got
    if len(by_path) == 2:
        by_path["faster"] = {
            s: min((by_path[p][s] for p in ("gemv", "cublas")), key=lambda r: r["us"]) for s in shapes
        }
    out = {}
    for path, got in by_path.items():
        us = sum(got[s]["us"] * c for s, c in count.items())
        nbytes = sum(got[s]["weight_mb"] * 1e6 * c for s, c in count.items())
        out[path] = dict(
            ms=round(us / 1e3, 3), tb_s=round(nbytes / us / 1e6, 3), of_peak=round(nbytes / us / 1e6 / 4.8, 3)
        )
        if path == "faster":
            out[path]["gemv_shapes"] = sorted(s for s in shapes if got[s]["path"] == "gemv")
    return out


def table_rows(rows: list[dict], margin: float = 0.03) -> dict[str, int]:
    """Per shape key (kernels/gemv_table.py), the most rows the GEMV should take: the largest batch m at which
    it beats cuBLAS by `margin` while it is no slower (within `margin`) at every smaller batch timed; 0 if
    none. A tie at one row and a win at two (o_proj on the H200) gives 2."""
    from tokenspeed.runtime.kernels.gemv_table import shape_key

    speedups: dict[str, list[tuple[int, float]]] = {}
    for r, base in gt.against(rows, "cublas"):
        speedups.setdefault(shape_key(r["n"], r["k"], "bfloat16"), []).append((r["m"], base["us"] / r["us"]))
    out: dict[str, int] = {}
    for key, timed in speedups.items():
        out[key] = 0
        for m, speedup in sorted(timed):
            if speedup < 1 - margin:
                break  # slower here: neither this batch nor a larger one takes it
            if speedup >= 1 + margin:
                out[key] = m
    return out


def config_from_row(text: str) -> dict[str, int]:
    """A row's winning configuration (`str(triton.Config)`, "BLOCK_N: 8, BLOCK_K: 512, ..., num_warps: 4,
    ...") as a tuned table names it (`gemv_table.CONFIG_FIELDS`)."""
    from tokenspeed.runtime.kernels.gemv_table import CONFIG_FIELDS

    fields = dict(part.split(": ", 1) for part in text.split(", "))
    return {name: int(fields[name]) for name in CONFIG_FIELDS}


def table_configs(rows: list[dict], max_rows: dict[str, int]) -> dict[str, dict[str, dict[str, int]]]:
    """Per shape key and batch bucket the GEMV takes, the configuration that won that row's autotuning: the
    table ships it, so a server launches it instead of tuning again (and every process sums alike)."""
    from tokenspeed.runtime.kernels.bf16_gemv import m_bucket
    from tokenspeed.runtime.kernels.gemv_table import shape_key

    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in rows:
        key = shape_key(r["n"], r["k"], "bfloat16")
        if r["path"] == "gemv" and "us" in r and r.get("config") and r["m"] <= max_rows.get(key, 0):
            out.setdefault(key, {})[str(m_bucket(r["m"]))] = config_from_row(r["config"])
    return out


def write_table(
    path: str,
    device_name: str,
    max_rows: dict[str, int],
    base: str | None = None,
    configs: dict[str, dict[str, dict[str, int]]] | None = None,
) -> None:
    """The tuned table `--dense-gemv-backend auto` reads (copy it to tokenspeed/runtime/kernels/tuned/);
    `base`: a table whose other shapes it keeps (this run's figures win for the shapes both have)."""
    from tokenspeed.bench_results import provenance
    from tokenspeed.runtime.kernels.gemv_table import load_table, to_json

    configs = dict(configs or {})
    skinny = None
    if base:
        old = json.loads(Path(base).read_text())
        kept = {key: cfg for key, cfg in old.get("configs", {}).items() if key not in max_rows}
        max_rows, configs = {**old["shapes"], **max_rows}, {**kept, **configs}
        skinny = old.get("skinny")  # the skinny GEMM's entries (benchmarks/skinny_gemm.py) stay as they are
    data = to_json(device_name, max_rows, provenance(), configs, skinny)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    load_table(path)  # what the server will read
    print(f"wrote {path}: the GEMV takes {max_rows}")


def table_from_results(paths: list[str], out: str) -> None:
    """`--table-from`: the tuned table of earlier runs' results files (no GPU needed), each file's verdicts
    and winning configurations over the ones before it."""
    max_rows: dict[str, int] = {}
    configs: dict[str, dict[str, dict[str, int]]] = {}
    devices = set()
    for path in paths:
        data = json.loads(Path(path).read_text())
        devices.add(data["device"]["gpu"])
        rows = table_rows(data["rows"])
        max_rows.update(rows)
        configs.update(table_configs(data["rows"], rows))
    if len(devices) != 1:
        raise SystemExit(f"--table-from: the results files come from {sorted(devices)}; a table is one GPU's")
    write_table(out, devices.pop(), max_rows, configs=configs)


def main() -> None:
    names = dict.fromkeys(n for shapes, _ in MODELS.values() for n in shapes)
    args = gt.parse_args(
        __doc__, names, [1, 2, 4], str(ROOT / "benchmarks/results/gpu_bf16_gemv.json"),
        models=tuple(MODELS),
    )  # fmt: skip
    if args.table_from:
        if not args.table_out:
            raise SystemExit("--table-from needs --table-out (where the table goes)")
        table_from_results(args.table_from, args.table_out)
        return
    shapes, layers = MODELS[args.model]
    start = time.perf_counter()
    bw, rows = gt.run_shapes(bench_shape, shapes, args.shapes or list(shapes), args.m)
    speedup = {}
    print(f"{'shape':8s} {'m':>2s} {'gemv us':>9s} {'cublas us':>9s} {'gemv/4.8':>8s} {'cublas/4.8':>10s} "
          f"{'gemv/copy':>9s} {'speedup':>7s}")  # fmt: skip
    for r, base in gt.against(rows, "cublas"):
        speedup[f"{r['shape']}/m{r['m']}"] = round(base["us"] / r["us"], 3)
        print(f"{r['shape']:8s} {r['m']:2d} {r['us']:9.2f} {base['us']:9.2f} {r['of_peak']:8.3f} "
              f"{base['of_peak']:10.3f} {r['of_copy_bw']:9.3f} {base['us'] / r['us']:7.2f}x")  # fmt: skip
    steps = {f"m{m}": step_estimate(rows, m, shapes, layers) for m in args.m}
    for m, est in steps.items():
        print(
            f"decode-step linears {m}: "
            + ", ".join(f"{p} {e['ms']} ms ({e['of_peak']} of 4.8 TB/s)" for p, e in est.items())
        )
    if args.table_out:
        verdicts = table_rows(rows)
        write_table(
            args.table_out,
            torch.cuda.get_device_name(0),
            verdicts,
            args.table_base,
            table_configs(rows, verdicts),
        )
    seconds = round(time.perf_counter() - start, 1)
    print(f"total {seconds} s")
    gt.save_results(
        args.out,
        "bf16_gemv",
        bw,
        model=args.model,
        gemv_speedup_over_cublas=speedup,
        step_estimate=steps,
        seconds=seconds,
        rows=rows,
    )


if __name__ == "__main__":
    main()
