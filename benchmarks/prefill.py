"""Time to first token of one prompt against its length, and its share of the bf16 matmul peak.

Llama-3.1-8B shape, dummy bf16 weights. Each prompt is prefilled as one chunk through the engine's
ModelRunner (attention backend planning, the model forward, the greedy pick of the first token), timed
with CUDA events (median of 5). FLOPs counted: 2 x (non-embedding matmul parameters) per prompt token,
the LM head once, and causal attention 2 x L^2 x head_dim x heads per layer (QK^T and PV over half the
square). Peak: an 8192^3 bf16 product on random data in the same run. Writes
benchmarks/results/gpu_prefill.json.

    python benchmarks/prefill.py [--backends flashinfer triton] [--lengths 256 ... 8192]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks.gpu_common import gc_collect_cuda  # noqa: E402


def prefill_flops(cfg: dict, length: int) -> float:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kvh, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    per_layer = h * (heads * d + 2 * kvh * d) + heads * d * h + 3 * h * inter
    linear = 2 * per_layer * layers * length + 2 * h * cfg["vocab_size"]
    attention = 2 * length * length * d * heads * layers
    return float(linear + attention)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["flashinfer", "triton"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096, 8192])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_prefill.json"))
    args = ap.parse_args()

    peak = gc.matmul_peak()
    print(f"bf16 matmul peak (8192^3, random data): {peak / 1e12:.1f} TFLOP/s")
    cfg = gc.LLAMA_8B
    model_dir = gc.write_config(cfg, "llama8b")
    rows = []
    for backend in args.backends:
        core = gc.make_core(
            model_dir,
            attention_backend=backend,
            sampling_backend="greedy",
            enforce_eager=True,
            max_num_seqs=4,
            max_total_tokens=max(args.lengths) + 256,
            max_model_len=max(args.lengths) + 64,
            chunked_prefill_size=max(args.lengths),
        )
        runner = core.runner
        gc.fill_kv_random(runner.kv_pool)
        for length in args.lengths:
            fb = gc.synthetic_batch(runner, 1, 0, new_tokens=length)

            def step(fb=fb, runner=runner):
                torch.argmax(runner.run(fb, use_graphs=False), dim=-1)

            with torch.inference_mode():
                t = gc.time_cuda(step, iters=5, warmup=2)
            flops = prefill_flops(cfg, length)
            row = dict(
                backend=backend,
                prompt_len=length,
                ttft_ms=round(t * 1e3, 3),
                tflops=round(flops / t / 1e12, 1),
                share_of_peak=round(flops / t / peak, 4),
                prefill_tok_s=round(length / t, 0),
            )
            rows.append(row)
            print(
                f"{backend:10s} len={length:5d} ttft={t * 1e3:8.2f} ms  {flops / t / 1e12:6.1f} TFLOP/s  "
                f"share={flops / t / peak:.3f}"
            )
        core.shutdown()
        core = runner = None
        gc_collect_cuda()
    gc.save_run(
        args.out,
        "prefill",
        "Llama-3.1-8B shape, dummy bf16 weights",
        matmul_peak_tflops=round(peak / 1e12, 1),
        rows=rows,
    )


if __name__ == "__main__":
    main()
