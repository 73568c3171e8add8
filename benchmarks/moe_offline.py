"""MoE offline throughput per configuration: the Engine, Qwen3-30B-A3B shape (dummy bf16 weights), one
process, one configuration after another (benchmarks/moe_bench.py: default, record, triton, eplb, torch).

Per configuration: `--num-requests` prompts of ~`--input-len` tokens (uniform in [0.5x, 1.5x]) and
exactly `--output-len` output tokens (EOS ignored), all submitted at once, streamed; while they run the
stats the server's metrics exporter reads (`get_stats`, the expert load included when recorded) are read
every 0.1 s, as the scheduler process does for the front end. Then one request alone: ms per output
token between its first and last token (batch-1 decode through the whole engine). The reference torch
experts run a smaller workload (`--torch-requests`), marked so. Writes benchmarks/results/gpu_moe.json.

    python benchmarks/moe_offline.py [--configs default record triton eplb torch]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks.moe_bench import MOE_CONFIGS  # noqa: E402
from benchmarks.offline_throughput import make_prompts  # noqa: E402

STATS_INTERVAL_S = 0.1
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def run_stream(engine, prompts, out_len: int) -> dict:
    params = {"max_new_tokens": out_len, "temperature": 0.0, "ignore_eos": True}
    tokens = stats_reads = 0
    first = last = None
    next_stats = time.perf_counter()
    start = time.perf_counter()
    for chunk in engine.generate(input_ids=prompts, sampling_params=params, stream=True):
        now = time.perf_counter()
        n = len(chunk["output_ids"])
        if n:
            tokens += n
            first = now if first is None else first
            last = now
        if now >= next_stats:
            engine.get_stats()
            stats_reads += 1
            next_stats = now + STATS_INTERVAL_S
    elapsed = time.perf_counter() - start
    return dict(
        seconds=elapsed, tokens=tokens, first=first - start, last=last - start, stats_reads=stats_reads
    )


def bench_config(name: str, model_dir: str, args) -> dict:
    from tokenspeed import Engine

    vocab = gc.QWEN3_30B_A3B["vocab_size"]
    reduced = name == "torch"
    n_req = args.torch_requests if reduced else args.num_requests
    out_len = args.torch_output_len if reduced else args.output_len
    prompts = make_prompts(n_req, args.input_len, vocab, seed=1)
    t0 = time.perf_counter()
    with Engine(
        model=model_dir,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        max_num_seqs=max(CAPTURE_SIZES),
        cudagraph_capture_sizes=CAPTURE_SIZES,
        max_model_len=2 * args.input_len + out_len + 64,
        **MOE_CONFIGS[name],
    ) as engine:
        startup = time.perf_counter() - t0
        graphs = engine.core.runner.graph_runner is not None
        run_stream(engine, prompts[:4], 4)  # warm-up
        r = run_stream(engine, prompts, out_len)
        one = run_stream(engine, prompts[:1], out_len)
        experts = getattr(engine.core, "experts", None)
        eplb = getattr(experts, "eplb", None)
        recorder = getattr(experts, "recorder", None)
        row = dict(
            config=name,
            server_args=MOE_CONFIGS[name],
            cuda_graphs=graphs,
            requests=n_req,
            output_len=out_len,
            reduced_workload=reduced,
            startup_s=round(startup, 1),
            seconds=round(r["seconds"], 2),
            output_tokens=r["tokens"],
            output_tok_s=round(r["tokens"] / r["seconds"], 1),
            stats_reads=r["stats_reads"],
            bs1_ms_per_token=round((one["last"] - one["first"]) / max(1, one["tokens"] - 1) * 1e3, 3),
            recording=bool(recorder is not None and recorder.recording),
            recorded_passes=recorder.state.passes if recorder is not None else 0,
            rebalances=eplb.stats.rebalances if eplb is not None else 0,
            rebalance_stall_s=round(eplb.stats.seconds, 4) if eplb is not None else 0.0,
        )
    gc.gc_collect_cuda()
    print(f"{name:8s} {row}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["default", "record", "triton", "eplb", "torch"])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--torch-requests", type=int, default=16)
    ap.add_argument("--torch-output-len", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_moe.json"))
    args = ap.parse_args()
    model_dir = gc.write_config(gc.QWEN3_30B_A3B, "qwen3moe")
    rows = []
    for name in args.configs:
        try:
            rows.append(bench_config(name, model_dir, args))
        except Exception as e:  # one failing configuration must not lose the others' figures
            print(f"{name}: failed: {e!r}")
            rows.append(dict(config=name, error=repr(e)))
    by = {r["config"]: r for r in rows if "output_tok_s" in r}
    summary = {}
    if "default" in by:
        base = by["default"]["output_tok_s"]
        for name, r in by.items():
            if not r["reduced_workload"]:
                summary[f"{name}_vs_default"] = round(r["output_tok_s"] / base, 4)
        full = {k: v for k, v in by.items() if not v["reduced_workload"]}
        summary["best_config"] = max(full, key=lambda k: full[k]["output_tok_s"])
        if "record" in by:
            summary["recording_cost"] = round(1 - by["record"]["output_tok_s"] / base, 4)
    print("summary:", summary)
    gc.save_run(
        args.out,
        "moe_offline",
        "Qwen3-30B-A3B shape, dummy bf16 weights",
        workload=dict(requests=args.num_requests, input_len=args.input_len, output_len=args.output_len),
        summary=summary,
        rows=rows,
    )


if __name__ == "__main__":
    main()
