"""Offline throughput on the CPU: the TokenSpeed Engine against transformers generate(), same model, same run.

The model is the demo model the quick start serves (shipped with TokenSpeed; `--model tiny`: the engine
tests' random one). Prompts are random token ids of random lengths; every side generates a fixed number of
tokens per prompt (EOS ignored) and is timed after a warm-up (best of --repeats runs). transformers runs
twice: the whole batch in one left-padded generate() call (its fastest offline mode), and one generate()
call per prompt (how a naive server would use it). The Engine runs twice too: in the synchronous step order
(the CPU default) and with overlap scheduling (`tokenspeed_overlap`, the GPU default; on the CPU the host
and the "device" are the same thread, so it has nothing to hide). Prints a table and writes
benchmarks/results/cpu_engine.json.

    python benchmarks/cpu_engine.py [--num-prompts 32] [--output-len 64] [--model demo|tiny]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cpu_common import best, machine  # noqa: E402
from benchmarks.hf_baseline import generate_left_padded  # noqa: E402
from tests.tiny_models import load_hf_model, make_tiny_model  # noqa: E402
from tokenspeed import Engine  # noqa: E402
from tokenspeed.bench_results import write_results  # noqa: E402
from tokenspeed.demo_models import demo_model_path  # noqa: E402

SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)

# The demo model `tokenspeed up profiles/demo.toml` serves (shipped, trained), or the engine tests' random one.
MODELS = ("demo", "tiny")


def model_path(name: str, tmp: str) -> str:
    return str(demo_model_path("demo")) if name == "demo" else make_tiny_model("llama", tmp)


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_engine(engine: Engine, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    params = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o["output_ids"]) for o in outs)


def run_transformers(model, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = generate_left_padded(model, prompts, output_len, model.config.pad_token_id)  # the model's own
    return time.perf_counter() - start, tokens


def run_transformers_each(model, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = 0
    for p in prompts:
        t, n = run_transformers(model, [p], output_len)
        tokens += n
    return time.perf_counter() - start, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="demo")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per side; the fastest counts")
    ap.add_argument("--per-prompt", type=int, default=8, help="prompts timed with one generate() each")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu_engine.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args.model, tmp)
        hf = load_hf_model(path)
        hf_shape = hf.config.to_dict()
        prompts = make_prompts(args.num_prompts, *args.input_len, hf.config.vocab_size, args.seed)
        warm = prompts[:2]

        run_transformers(hf, warm, 4)
        hf_s, hf_tokens = best(args.repeats, lambda: run_transformers(hf, prompts, args.output_len))
        each = prompts[: args.per_prompt]
        each_s, each_tokens = best(1, lambda: run_transformers_each(hf, each, args.output_len))
        hf = None  # free the reference model before the engine loads its copy

        timings = {}
        # The CPU default (the synchronous step order) and overlap scheduling, same model and prompts.
        for name, overlap_off in (("tokenspeed", True), ("tokenspeed_overlap", False)):
            with Engine(
                model=path,
                device="cpu",
                dtype="float32",
                block_size=16,
                max_total_tokens=32768,
                disable_overlap_schedule=overlap_off,
            ) as engine:
                run_engine(engine, warm, 4)
                timings[name] = best(
                    args.repeats,
                    lambda engine=engine: run_engine(engine, prompts, args.output_len),
                    before=engine.flush_cache,
                )

    result = {
        "benchmark": "cpu_engine",
        "model": {"name": args.model, **{k: hf_shape[k] for k in SHAPE_KEYS}},
        "num_prompts": args.num_prompts,
        "input_len": list(args.input_len),
        "output_len": args.output_len,
        **machine(args.threads),
        **{
            name: {"seconds": round(t, 3), "output_tokens": n, "tokens_per_s": round(n / t, 1)}
            for name, (t, n) in timings.items()
        },
        "transformers": {
            "seconds": round(hf_s, 3),
            "output_tokens": hf_tokens,
            "tokens_per_s": round(hf_tokens / hf_s, 1),
        },
        "transformers_per_prompt": {
            "seconds": round(each_s, 3),
            "output_tokens": each_tokens,
            "tokens_per_s": round(each_tokens / each_s, 1),
        },
    }
    ours = result["tokenspeed"]["tokens_per_s"]
    result["speedup"] = round(ours / result["transformers"]["tokens_per_s"], 2)
    result["speedup_vs_per_prompt"] = round(ours / result["transformers_per_prompt"]["tokens_per_s"], 2)
    print(f"{'':24}{'seconds':>10}{'tokens':>10}{'tokens/s':>12}")
    for name in ("tokenspeed", "tokenspeed_overlap", "transformers", "transformers_per_prompt"):
        r = result[name]
        print(f"{name:24}{r['seconds']:>10.2f}{r['output_tokens']:>10}{r['tokens_per_s']:>12.1f}")
    print(
        f"speedup {result['speedup']}x over batched generate(), {result['speedup_vs_per_prompt']}x over "
        f"generate() per prompt ({args.num_prompts} prompts, output {args.output_len}, {args.threads} threads)"
    )
    write_results(args.out, result)


if __name__ == "__main__":
    main()
