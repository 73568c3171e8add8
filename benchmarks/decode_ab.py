"""Whole decode steps with and without a speed-up, in one process, alternating: programmatic dependent
launch (`pdl`, `kernels/pdl.py`), decode attention in one launch (`one`, `kernels/decode_attention.py`), on a
MoE shape the few-token MoE GEMV at the configurations `benchmarks/results/gpu_moe_gemv.json` found best
(`gemv`, `moe/kernels/gemv.py`) and the same with the routing in its first launch (`route`), the dense
layers' larger batches on the skinny GEMM where `--skinny-table` names it (`skinny`,
`kernels/skinny_gemm.py`), or any combination (`pdl+one`, `pdl+route`, `pdl+one+route`, ...). `plain` has
none of them, PDL included (on by default in the server).

Each changes a step by a few percent at most (`benchmarks/pdl_probe.py`: PDL 1.034x on a chain of GEMVs),
less than two runs of `benchmarks/decode.py` in separate processes differ (1-3% at the same settings). So
one engine core is built (dummy bf16 weights, the Triton attention backend, greedy), its CUDA graphs are
captured plainly and once more per variant (PDL's launch option and the kernels chosen are recorded in the
graph), and the graph sets are replayed in turns over the same batch: `--rounds` rounds of `--iters`
steps back to back each, the order reversed every round. Per batch size and variant it reports the median
step, the speed-up over plain, every round's figures, and how the logits compare with plain's: PDL changes
when a kernel starts, never what it computes (bit-equal); a kernel that merges split partials in another
order may not be (the largest difference, and whether the greedy tokens agree). Limit and ratio as in
`benchmarks/decode.py`: the bytes a step must read over the copy bandwidth measured in the same run.

    python benchmarks/decode_ab.py [--model llama8b|qwen3moe] [--variants pdl pdl+one pdl+gemv pdl+route ...]
        [--batch-sizes 1 64] [--context 1024] [--rounds 6] [--iters 50] [--dense-gemv-backend auto|triton]
        [--out benchmarks/results/gpu_decode_ab_<model>.json]

`--dense-gemv-backend triton` sends every dense shape through the GEMV (`auto`, the default, only those the
GPU's tuned table names).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks import kernel_profile, moe_bench  # noqa: E402
from benchmarks.decode import MODELS, time_back_to_back  # noqa: E402
from tokenspeed.runtime.kernels import pdl  # noqa: E402
from tokenspeed.runtime.kernels.decode_attention import ONE_LAUNCH_ENV  # noqa: E402
from tokenspeed.runtime.kernels.gemv_table import load_table  # noqa: E402
from tokenspeed.runtime.layers.dense_gemv import TritonGemv  # noqa: E402

PDL_ENV = pdl.ENV

# What a variant can turn on; a variant is any of them joined with "+" (`pdl+one+route`: every opt-in of a
# MoE step at once).
PARTS = ("pdl", "one", "gemv", "route", "skinny")
# the default: what every shape takes without further input (`gemv` and `route` change MoE steps only;
# `skinny` needs --skinny-table)
VARIANTS = ("pdl", "one", "pdl+one")
MOE_GEMV_RESULTS = ROOT / "benchmarks/results/gpu_moe_gemv.json"


def tuned_moe_gemv_table(results: Path = MOE_GEMV_RESULTS):
    """The MoE GEMV at the configuration that won each token count in `benchmarks/moe_tune.py --gemv`'s last
    run (`results`, by default `MOE_GEMV_RESULTS`), at the token counts where it came within 10% of the tensor-core path timed
    alone (its launches fewer a step are what this benchmark weighs): what `gemv` and `route` time."""
    import json

    from tokenspeed.runtime.moe.kernels.gemv import MoeGemvConfig
    from tokenspeed.runtime.moe.kernels.gemv_table import GemvTable, shape_key

    data = json.loads(Path(results).read_text())
    shape = data["shape"]
    key = shape_key(shape["experts"], shape["intermediate"], shape["hidden"], torch.bfloat16)
    close = [r for r in data["rows"] if r["gemv_best_us"] <= 1.1 * r["tensor_core_us"]]
    rows = tuple(
        (r["tokens"], MoeGemvConfig(**r["gemv_config"])) for r in sorted(close, key=lambda r: r["tokens"])
    )
    return GemvTable({key: rows}, source=str(results))


def variant_name(name: str) -> str:
    """`--variants`' type: parts of PARTS joined with "+", each once."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in PARTS]
    if unknown or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(
            f"{name!r}: a variant is parts of {', '.join(PARTS)} joined with '+', each once"
            + (f" ({', '.join(unknown)} unknown)" if unknown else "")
        )
    return name


@contextmanager
def variant(model: torch.nn.Module, name: str, skinny_table=None, moe_table=None):
    """The opt-ins `name` turns on, for the span of a graph capture (`skinny`: the dense layers read
    `skinny_table`, a tuned table with the skinny GEMM's entries)."""
    gemvs = {
        id(m.quant): m.quant for m in model.modules() if isinstance(getattr(m, "quant", None), TritonGemv)
    }
    moes = {
        id(m.backend): m.backend
        for m in model.modules()
        if hasattr(getattr(m, "backend", None), "fuse_route")
    }
    parts = set(name.split("+")) if name != "plain" else set()
    saved = {env: os.environ.get(env) for env in (PDL_ENV, ONE_LAUNCH_ENV)}
    tables = {k: b.gemv_table for k, b in moes.items()}
    dense_tables = {k: q.table for k, q in gemvs.items()}
    try:
        if "skinny" in parts:
            for q in gemvs.values():
                q.use_table(skinny_table)
        os.environ[PDL_ENV] = "1" if "pdl" in parts else "0"
        os.environ[ONE_LAUNCH_ENV] = "1" if "one" in parts else "0"
        for b in moes.values():  # `route`: the GEMV at its tuned configurations, routing in its first launch
            if parts & {"gemv", "route"}:
                b.gemv_table = moe_table if moe_table is not None else tuned_moe_gemv_table()
            b.fuse_route = "route" in parts
        yield
    finally:
        for env, value in saved.items():
            if value is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = value
        for k, b in moes.items():
            b.gemv_table, b.fuse_route = tables[k], False
        for k, q in gemvs.items():
            q.use_table(dense_tables[k])


def profile_variants(runner, fb, names: list[str], skinny_table, moe_table) -> dict:
    """Each variant's eager step through torch.profiler (`benchmarks/kernel_profile.py`): how many kernels
    it launches and each group's kernel time, so a speed-up (or a loss) shows where it comes from. A
    diagnostic: a failure is printed, never allowed to lose the timings."""
    out = {}
    for name in names:
        try:
            with variant(runner.model, name, skinny_table, moe_table), torch.inference_mode():
                out[name] = kernel_profile.profile_step(
                    lambda: torch.argmax(runner.run(fb, use_graphs=False), dim=-1)
                )
        except Exception as e:  # noqa: BLE001
            print(f"{name}: kernel profile failed: {e!r}")
            continue
        print(kernel_profile.describe(f"bs={fb.batch_size:4d} kernels/step {name:14s}", out[name]))
    return out


def alternate(runner, graphs: dict, step, rounds: int, iters: int) -> dict[str, list[float]]:
    """Seconds per step of each graph set, `rounds` times, in turns (the order reversed every round)."""
    times: dict[str, list[float]] = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            runner.graph_runner = graphs[name]
            times[name].append(time_back_to_back(step, iters=iters))
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama8b")
    ap.add_argument("--variants", nargs="+", type=variant_name, default=list(VARIANTS))
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--dense-gemv-backend", choices=["auto", "triton"], default="auto")
    ap.add_argument("--skinny-table", default=None, help="a tuned table with skinny entries, for `skinny`")
    ap.add_argument(
        "--moe-gemv-results",
        default=str(MOE_GEMV_RESULTS),
        help="the `moe_tune.py --gemv` results whose best configurations `gemv` and `route` run",
    )
    ap.add_argument("--out", default=None, help="default: benchmarks/results/gpu_decode_ab_<model>.json")
    args = ap.parse_args()
    out = args.out or str(ROOT / f"benchmarks/results/gpu_decode_ab_{args.model}.json")
    if any("skinny" in v.split("+") for v in args.variants) and not args.skinny_table:
        ap.error("the skinny variants need --skinny-table (benchmarks/skinny_gemm.py --table-out writes one)")

    for env in (PDL_ENV, ONE_LAUNCH_ENV):
        os.environ.pop(env, None)
    device = torch.device("cuda")
    if "pdl" in " ".join(args.variants) and not pdl.enabled(device):
        print(
            f"{torch.cuda.get_device_name(device)}: no programmatic dependent launch (compute capability < 9)"
        )
        return 1
    os.environ[PDL_ENV] = "0"  # the core's own graphs are the plain ones: no PDL either
    bw = gc.copy_bandwidth()
    print(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s (read + write)")
    model_cfg, label = MODELS[args.model]
    model_dir = gc.write_config(model_cfg, args.model)
    sizes = sorted(set(args.batch_sizes))
    page_tokens = -(-(args.context + 1) // 64) * 64
    make_core = moe_bench.make_core if "num_experts" in model_cfg else gc.make_core
    core = make_core(
        model_dir, attention_backend="triton", sampling_backend="greedy", max_num_seqs=max(sizes),
        cudagraph_capture_sizes=sizes, max_total_tokens=(max(sizes) + 1) * page_tokens + 4096,
        max_model_len=args.context + 64, dense_gemv_backend=args.dense_gemv_backend,
    )  # fmt: skip
    runner = core.runner
    gc.fill_kv_random(runner.kv_pool)
    graphs = {"plain": runner.graph_runner}
    skinny_table = load_table(args.skinny_table) if args.skinny_table else None
    moe_table = None
    if any({"gemv", "route"} & set(v.split("+")) for v in args.variants):
        moe_table = tuned_moe_gemv_table(Path(args.moe_gemv_results))
        print(f"the MoE GEMV's configurations for `gemv` and `route`: {moe_table.source}")
    for name in args.variants:
        with variant(runner.model, name, skinny_table, moe_table):
            runner.capture_graphs()
        graphs[name] = runner.graph_runner

    experts = model_cfg.get("num_experts")
    per_token_kv = runner.kv_pool.spec.bytes_per_token()
    rows = []
    for bs in sizes:
        fb = gc.synthetic_batch(runner, bs, args.context)
        logits = {}
        with torch.inference_mode():
            for name, g in graphs.items():
                runner.graph_runner = g
                logits[name] = runner.run(fb).clone()

            def step(fb=fb):
                torch.argmax(runner.run(fb), dim=-1)

            times = alternate(runner, graphs, step, args.rounds, args.iters)
            profiles = profile_variants(runner, fb, ["plain", *args.variants], skinny_table, moe_table)
        active = 1.0
        if experts:
            active = gc.expected_active_experts(experts, model_cfg["num_experts_per_tok"], bs) / experts
        limit = (gc.weight_bytes_read(runner.model, active) + bs * (args.context + 1) * per_token_kv) / bw
        med = {name: statistics.median(t) for name, t in times.items()}
        row = dict(
            batch=bs, context=args.context, limit_ms=round(limit * 1e3, 4),
            plain_step_ms=round(med["plain"] * 1e3, 4), plain_ratio=round(limit / med["plain"], 4),
            plain_rounds_ms=[round(t * 1e3, 4) for t in times["plain"]], variants={},
            kernel_profile=profiles,
        )  # fmt: skip
        for name in args.variants:
            diff = (logits[name] - logits["plain"]).abs().max()
            row["variants"][name] = dict(
                step_ms=round(med[name] * 1e3, 4),
                speedup=round(med["plain"] / med[name], 4),
                ratio=round(limit / med[name], 4),
                rounds_ms=[round(t * 1e3, 4) for t in times[name]],
                logits_bit_equal=bool(torch.equal(logits[name], logits["plain"])),
                max_logit_diff=float(diff),
                same_greedy_tokens=bool(torch.equal(logits[name].argmax(-1), logits["plain"].argmax(-1))),
            )
            v = row["variants"][name]
            print(
                f"{args.model} bs={bs:4d} plain={row['plain_step_ms']:8.3f} ms (ratio {row['plain_ratio']:.3f})  "
                f"{name}={v['step_ms']:8.3f} ms (ratio {v['ratio']:.3f})  speedup={v['speedup']:.4f}  "
                f"logits bit-equal {v['logits_bit_equal']} (max diff {v['max_logit_diff']:.3g}), "
                f"same greedy tokens {v['same_greedy_tokens']}"
            )
        rows.append(row)
    runner.graph_runner = graphs["plain"]
    core.shutdown()
    gc.save_run(
        out, "decode_ab", label, copy_bandwidth_tb_s=round(bw / 1e12, 4), attention_backend="triton",
        dense_gemv_backend=args.dense_gemv_backend, rounds=args.rounds, iters=args.iters, rows=rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
