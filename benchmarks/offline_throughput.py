"""Offline throughput on the GPU: the TokenSpeed Engine against transformers generate(), same run, same GPU.

Llama-3.1-8B shape with dummy bf16 weights (no download; both sides get random weights, which does not
change the work done). Two workloads of random prompts: input ~1024 / output 256 and input ~128 / output
1024 tokens (input lengths uniform in [0.5x, 1.5x], outputs exactly that long, EOS ignored). The Engine
gets every request at once; transformers runs left-padded batches of `--hf-batch` through generate()
(greedy, its fastest offline mode) on a subset of the requests. Output tokens/s of each, and the ratio.
Writes benchmarks/results/gpu_offline_throughput.json.

    python benchmarks/offline_throughput.py [--num-requests 1000] [--hf-requests 64] [--hf-batch 64]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks.hf_baseline import generate_left_padded  # noqa: E402

WORKLOADS = {"in1024_out256": (1024, 256), "in128_out1024": (128, 1024)}


def make_prompts(n: int, mean_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(10, vocab - 10) for _ in range(rng.randint(mean_len // 2, mean_len * 3 // 2))]
        for _ in range(n)
    ]


def run_transformers(model_dir: str, prompts: list[list[int]], out_len: int, batch: int) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()

    def run(chunk):
        return generate_left_padded(model, chunk, out_len, pad_id=0)

    run(prompts[: min(2, len(prompts))])  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = sum(run(prompts[i : i + batch]) for i in range(0, len(prompts), batch))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    model = None
    gc.gc_collect_cuda()
    return dict(requests=len(prompts), batch=batch, seconds=round(elapsed, 2), output_tokens=tokens,
                output_tok_s=round(tokens / elapsed, 1))  # fmt: skip


def run_engine(engine, prompts: list[list[int]], out_len: int) -> dict:
    params = {"max_new_tokens": out_len, "temperature": 0.0, "ignore_eos": True}
    engine.generate(input_ids=prompts[:4], sampling_params={**params, "max_new_tokens": 4})  # warm-up
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o["output_ids"]) for o in outs)
    inputs = sum(len(p) for p in prompts)
    return dict(requests=len(prompts), seconds=round(elapsed, 2), output_tokens=tokens, input_tokens=inputs,
                output_tok_s=round(tokens / elapsed, 1), total_tok_s=round((tokens + inputs) / elapsed, 1))  # fmt: skip


def main() -> None:
    from tokenspeed import Engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--hf-requests", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="schedule synchronously (to compare with overlap)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_offline_throughput.json"))
    args = ap.parse_args()

    model_dir = gc.write_config(gc.LLAMA_8B, "llama8b")
    vocab = gc.LLAMA_8B["vocab_size"]
    results = {}
    for name in args.workloads:
        in_len, out_len = WORKLOADS[name]
        prompts = make_prompts(args.num_requests, in_len, vocab, seed=1)
        hf = run_transformers(model_dir, prompts[: args.hf_requests], out_len, args.hf_batch)
        print(f"{name}: transformers {hf}")
        results[name] = dict(transformers=hf)
    with Engine(
        model=model_dir,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        attention_backend=args.attention_backend,
        max_num_seqs=args.max_num_seqs,
        max_cudagraph_capture_size=args.max_num_seqs,
        max_model_len=4096,
        disable_overlap_schedule=args.disable_overlap_schedule,
    ) as engine:
        for name in args.workloads:
            in_len, out_len = WORKLOADS[name]
            prompts = make_prompts(args.num_requests, in_len, vocab, seed=1)
            ours = run_engine(engine, prompts, out_len)
            ratio = ours["output_tok_s"] / results[name]["transformers"]["output_tok_s"]
            results[name].update(tokenspeed=ours, speedup=round(ratio, 2))
            print(f"{name}: tokenspeed {ours}  speedup x{ratio:.1f}")
    gc.save_run(
        args.out,
        "offline_throughput",
        "Llama-3.1-8B shape, dummy bf16 weights",
        attention_backend=args.attention_backend or "default",
        overlap_schedule=not args.disable_overlap_schedule,
        results=results,
    )


if __name__ == "__main__":
    main()
