"""Whole decode steps with and without programmatic dependent launch (PDL), in one process, alternating.

A step with PDL and one without differ by a few percent at most (`benchmarks/pdl_probe.py`: 1.034x on a
chain of GEMVs), less than two runs of `benchmarks/decode.py` in separate processes differ (1-3% at the
same settings). So one engine core is built (dummy bf16 weights, the Triton attention backend, greedy),
its CUDA graphs are captured once plainly and once with TOKENSPEED_PDL=1 (`kernels/pdl.py`; the launch
option is recorded in the graph), and the two graph sets are replayed in turns over the same batch:
`--rounds` rounds of `--iters` steps back to back each, the order swapped every round. Per batch size it
reports the median step of each, their ratio, every round's figures, and whether the two give the same
logits to the bit (PDL changes when a kernel starts, never what it computes). Limit and ratio as in
`benchmarks/decode.py`: the bytes a step must read over the copy bandwidth measured in the same run.

    python benchmarks/pdl_decode.py [--model llama8b|qwen3moe] [--batch-sizes 1 64] [--context 1024]
        [--rounds 6] [--iters 50] [--out benchmarks/results/gpu_pdl_decode_<model>.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks import moe_bench  # noqa: E402
from benchmarks.decode import MODELS, time_back_to_back  # noqa: E402
from tokenspeed.runtime.kernels import pdl  # noqa: E402

ENV = "TOKENSPEED_PDL"


def alternate(runner, graphs: dict, step, rounds: int, iters: int) -> dict[str, list[float]]:
    """Seconds per step of each graph set, `rounds` times, in turns (the first of a round alternates)."""
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
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None, help="default: benchmarks/results/gpu_pdl_decode_<model>.json")
    args = ap.parse_args()
    out = args.out or str(ROOT / f"benchmarks/results/gpu_pdl_decode_{args.model}.json")

    os.environ.pop(ENV, None)  # the core's own graphs are the plain ones
    device = torch.device("cuda")
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
        max_model_len=args.context + 64,
    )  # fmt: skip
    runner = core.runner
    gc.fill_kv_random(runner.kv_pool)
    graphs = {"plain": runner.graph_runner}
    os.environ[ENV] = "1"
    if not pdl.enabled(device):
        print(
            f"{torch.cuda.get_device_name(device)}: no programmatic dependent launch (compute capability < 9)"
        )
        return 1
    runner.capture_graphs()
    graphs["pdl"] = runner.graph_runner
    os.environ.pop(ENV)

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
        active = 1.0
        if experts:
            active = gc.expected_active_experts(experts, model_cfg["num_experts_per_tok"], bs) / experts
        limit = (gc.weight_bytes_read(runner.model, active) + bs * (args.context + 1) * per_token_kv) / bw
        med = {name: statistics.median(t) for name, t in times.items()}
        row = dict(
            batch=bs,
            context=args.context,
            plain_step_ms=round(med["plain"] * 1e3, 4),
            pdl_step_ms=round(med["pdl"] * 1e3, 4),
            speedup=round(med["plain"] / med["pdl"], 4),
            limit_ms=round(limit * 1e3, 4),
            plain_ratio=round(limit / med["plain"], 4),
            pdl_ratio=round(limit / med["pdl"], 4),
            plain_rounds_ms=[round(t * 1e3, 4) for t in times["plain"]],
            pdl_rounds_ms=[round(t * 1e3, 4) for t in times["pdl"]],
            logits_bit_equal=bool(torch.equal(logits["plain"], logits["pdl"])),
            same_greedy_tokens=bool(torch.equal(logits["plain"].argmax(-1), logits["pdl"].argmax(-1))),
        )
        rows.append(row)
        print(
            f"{args.model} bs={bs:4d} plain={row['plain_step_ms']:8.3f} ms (ratio {row['plain_ratio']:.3f})  "
            f"pdl={row['pdl_step_ms']:8.3f} ms (ratio {row['pdl_ratio']:.3f})  speedup={row['speedup']:.4f}  "
            f"bit-equal logits: {row['logits_bit_equal']}"
        )
    runner.graph_runner = graphs["plain"]
    core.shutdown()
    gc.save_run(
        out, "pdl_decode", label, copy_bandwidth_tb_s=round(bw / 1e12, 4), attention_backend="triton",
        rounds=args.rounds, iters=args.iters, rows=rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
