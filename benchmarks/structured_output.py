"""What a JSON-schema constraint costs a decoding batch: the offline Engine on the CPU demo model, 32
requests of 64 output tokens each, with and without a schema that holds every token (a string of at
least 400 characters, so the grammar never completes), runs interleaved so machine load hits both alike.

    python benchmarks/structured_output.py [--repeats 10] [--batch 32]

Reports output tokens/s of each run, the median ratio of adjacent runs and the ratio of the best run of
each kind, the figure least disturbed by other load (goal: >= 0.9). Results go to
benchmarks/results/structured_output_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from tokenspeed import Engine
from tokenspeed.bench_results import write_results  # noqa: E402
from tokenspeed.demo_models import DEMO_MODELS

RESULTS = Path(__file__).resolve().parent / "results" / "structured_output_cpu.json"
SCHEMA = json.dumps({"type": "string", "minLength": 400})


def _run(engine: Engine, prompts: list[list[int]], out_len: int, schema: bool, seed: int) -> float:
    extra = {"json_schema": SCHEMA} if schema else {}
    params = [
        {"max_new_tokens": out_len, "temperature": 1.0, "ignore_eos": True, "seed": seed + i, **extra}
        for i in range(len(prompts))
    ]
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    assert all(len(o["output_ids"]) == out_len for o in outs)
    if schema:
        assert all(o["text"].startswith('"') for o in outs)
    return len(prompts) * out_len / elapsed


def schema_over_plain(tput: dict[str, list[float]]) -> dict:
    """The schema runs' output tok/s over the plain runs': of each adjacent pair, their median, and of the
    best run of each kind (the runs least disturbed by other work on the machine); printed as well."""
    ratios = [s / p for s, p in zip(tput["schema"], tput["plain"], strict=True)]
    out = {
        "ratio_schema_over_plain": ratios,
        "median_ratio": statistics.median(ratios),
        "best_ratio": max(tput["schema"]) / max(tput["plain"]),
    }
    print(
        f"median schema/plain of adjacent runs: {out['median_ratio']:.3f}; best of each: {out['best_ratio']:.3f}"
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 300, (args.batch, args.input_len), generator=gen).tolist()
    runs: dict[str, list[float]] = {"plain": [], "schema": []}
    with Engine(model=str(DEMO_MODELS[0].path), device="cpu", grammar_backend="xgrammar") as engine:
        _run(engine, prompts[:4], 8, True, 0)  # compile the grammar and warm up
        for k in range(args.repeats):
            for kind in ("plain", "schema") if k % 2 == 0 else ("schema", "plain"):
                runs[kind].append(_run(engine, prompts, args.output_len, kind == "schema", k))
                print(f"{kind:6s} run {k}: {runs[kind][-1]:.1f} output tok/s", flush=True)
    result = {
        "config": vars(args),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()},
        "output_tok_s": runs,
        **schema_over_plain(runs),
    }
    write_results(RESULTS, result)


if __name__ == "__main__":
    main()
