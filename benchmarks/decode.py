"""Decode step time of Llama-3.1-8B / Qwen3-30B-A3B-shaped models (dummy bf16 weights) against the bandwidth limit.

For each attention backend, batch size and context length, a decode step (the attention backend's
per-step planning on the host, CUDA-graph replay of the whole model, and the greedy pick) is timed with
CUDA events two ways: `step_ms`, 20 steps issued back to back over the count (the serving engine's order
with overlap scheduling, where the host plans step k+1 while the device runs step k), and `sync_step_ms`,
the median of 20 steps each waited for (host planning then counts in full). The bandwidth limit of a step
is the bytes it must read, the weights (all but the embedding table) plus every request's K and V, over
the device-to-device copy bandwidth measured in the same run; `ratio` = limit time / step_ms
(`sync_ratio` with sync_step_ms). At batch 1 and 64 the step's kernels are profiled (torch.profiler,
eager, the same kernels the graph replays): the count per step with the fused RoPE + KV write and without
it (the two launches per layer it replaces), and the GPU time per kind of kernel.
Writes benchmarks/results/gpu_decode.json.

    python benchmarks/decode.py [--model llama8b|qwen3moe] [--backends flashinfer triton] [--batch-sizes 1 ... 256]
        [--quantization fp8] [--kv-cache-dtype fp8_e4m3]

`--quantization fp8` quantizes the dummy weights to FP8 per channel at load (the limit then counts one byte
a weight), `--kv-cache-dtype fp8_e4m3` stores the KV cache in FP8 (one byte an element); their rows carry
the two settings and go to gpu_decode_<settings>.json unless `--out` says otherwise, beside the bf16 rows.

For the MoE model the weights counted are the dense ones plus the expected share of experts a batch
activates (uniform routing), and each `--moe-configs` entry (benchmarks/moe_bench.py) gets its rows:
`default` (no MoE flags: `--moe-backend auto`, the fused Triton MoE on CUDA), `record` (expert recording
kept on for metrics), `eplb`, `triton`, `torch` (the reference, decoding eagerly); the eager rows also
give the kernels of one MoE layer, fused against the torch reference.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks import kernel_profile, moe_bench  # noqa: E402
from benchmarks.gpu_common import gc_collect_cuda  # noqa: E402
from tokenspeed.runtime.kernels import pdl  # noqa: E402

DEFAULT_BS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
MODELS = {
    "llama8b": (gc.LLAMA_8B, "Llama-3.1-8B shape, dummy bf16 weights"),
    "qwen3moe": (gc.QWEN3_30B_A3B, "Qwen3-30B-A3B shape, dummy bf16 weights"),
}


def bench_backend(
    model_dir: str,
    backend: str,
    batch_sizes,
    contexts,
    bw: float,
    max_tokens: int,
    model_cfg: dict,
    moe_config: str | None = None,
    **extra,
) -> list[dict]:
    make_core = moe_bench.make_core if moe_config else gc.make_core
    core = make_core(
        model_dir,
        attention_backend=backend,
        sampling_backend="greedy",
        max_num_seqs=max(batch_sizes),
        cudagraph_capture_sizes=list(batch_sizes),
        max_total_tokens=max_tokens,
        max_model_len=max(contexts) + 64,
        **extra,
    )
    runner = core.runner
    gc.fill_kv_random(runner.kv_pool)
    experts = model_cfg.get("num_experts")
    per_token_kv = runner.kv_pool.spec.bytes_per_token()
    rows = []
    tag = {"moe_config": moe_config} if moe_config else {}
    tag.update({k: extra[k] for k in ("quantization", "kv_cache_dtype") if k in extra})
    name = f"{backend}/{moe_config}" if moe_config else backend
    for ctx in contexts:
        for bs in batch_sizes:
            try:
                fb = gc.synthetic_batch(runner, bs, ctx)
            except ValueError as e:
                print(f"{backend} ctx={ctx} bs={bs}: skipped ({e})")
                rows.append(dict(backend=backend, context=ctx, batch=bs, skipped=str(e), **tag))
                continue

            def step(fb=fb):
                torch.argmax(runner.run(fb), dim=-1)

            with torch.inference_mode():
                t_sync = gc.time_cuda(step, iters=20, warmup=3)
                t = time_back_to_back(step, iters=20)
            active = 1.0
            if experts:
                active = gc.expected_active_experts(experts, model_cfg["num_experts_per_tok"], bs) / experts
            wbytes = gc.weight_bytes_read(runner.model, active)
            kv_bytes = bs * (ctx + 1) * per_token_kv
            limit = (wbytes + kv_bytes) / bw
            row = dict(
                backend=backend,
                context=ctx,
                batch=bs,
                step_ms=round(t * 1e3, 4),
                tokens_per_s=round(bs / t, 1),
                weight_gb=round(wbytes / 1e9, 3),
                active_expert_share=round(active, 4),
                kv_gb=round(kv_bytes / 1e9, 3),
                limit_ms=round(limit * 1e3, 4),
                ratio=round(limit / t, 4),
                sync_step_ms=round(t_sync * 1e3, 4),
                sync_ratio=round(limit / t_sync, 4),
                **tag,
            )
            rows.append(row)
            print(
                f"{name:10s} ctx={ctx:5d} bs={bs:4d} step={t * 1e3:8.3f} ms  tok/s={bs / t:9.0f}  "
                f"limit={limit * 1e3:7.3f} ms  ratio={limit / t:.3f}  "
                f"(sync step={t_sync * 1e3:8.3f} ms ratio={limit / t_sync:.3f})"
            )
    # The same step without CUDA graphs, at batch 1 and 64 of the shortest context: what graphs buy.
    for bs in (1, 64):
        if bs > max(batch_sizes):
            continue
        fb = gc.synthetic_batch(runner, bs, contexts[0])

        def eager(fb=fb):
            torch.argmax(runner.run(fb, use_graphs=False), dim=-1)

        with torch.inference_mode():
            t = gc.time_cuda(eager, iters=10, warmup=2)
        try:
            kp = kernel_profile.fused_and_unfused(runner, fb)
        except Exception as e:  # the profile is a diagnostic: never lose the timings to it
            print(f"{backend}: kernel profile failed: {e!r}")
            kp = {"error": repr(e)}
        rows.append(
            dict(
                backend=backend, context=contexts[0], batch=bs, eager=True, step_ms=round(t * 1e3, 4),
                kernel_profile=kp, **tag,
            )
        )  # fmt: skip
        if moe_config:
            try:
                rows[-1]["moe_layer_kernels"] = moe_bench.moe_layer_kernels(runner, fb)
                print(f"{name:10s} bs={bs:4d} kernels per MoE layer: {rows[-1]['moe_layer_kernels']}")
            except Exception as e:  # a diagnostic, like the step profile
                print(f"{name}: MoE kernel count failed: {e!r}")
        print(f"{name:10s} ctx={contexts[0]:5d} bs={bs:4d} eager step={t * 1e3:8.3f} ms")
        for label in ("unfused", "fused") if "error" not in kp else ():
            print(kernel_profile.describe(f"{backend:10s} bs={bs:4d} kernels/step {label:7s}", kp[label]))
    core.shutdown()
    core = runner = None
    gc_collect_cuda()
    return rows


def time_back_to_back(fn, iters: int = 20) -> float:
    """Seconds per call of `fn()` issued `iters` times without waiting in between (after one warm call)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def faster_backend(rows: list[dict]) -> dict[str, str]:
    """Per "context/batch": the backend with the shorter step (graph replay rows only)."""
    best: dict[str, tuple[float, str]] = {}
    for r in rows:
        if r.get("eager") or "step_ms" not in r:
            continue
        key = f"{r['context']}/{r['batch']}"
        if key not in best or r["step_ms"] < best[key][0]:
            best[key] = (r["step_ms"], r["backend"])
    return {k: v[1] for k, v in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["flashinfer", "triton"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=DEFAULT_BS)
    ap.add_argument("--contexts", nargs="+", type=int, default=[1024, 4096])
    ap.add_argument("--max-total-tokens", type=int, default=540_000)
    ap.add_argument("--model", choices=sorted(MODELS), default="llama8b")
    ap.add_argument(
        "--moe-configs",
        nargs="+",
        default=["default", "record"],
        choices=sorted(moe_bench.MOE_CONFIGS),
        help="MoE configurations to time (MoE model only)",
    )
    ap.add_argument("--quantization", choices=["fp8"], default=None, help="FP8 weights, quantized at load")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e4m3"], default="auto")
    ap.add_argument(
        "--dense-gemv-backend",
        choices=["auto", "torch", "triton"],
        default=None,
        help="the dense layers' multiply at 1-4 rows (default: the server's, auto)",
    )
    ap.add_argument(
        "--out", default=None, help="default: benchmarks/results/gpu_decode[_<fp8 settings>].json"
    )
    args = ap.parse_args()
    settings = {}
    if args.quantization:
        settings["quantization"] = args.quantization
    if args.kv_cache_dtype != "auto":
        settings["kv_cache_dtype"] = args.kv_cache_dtype
    suffix = "".join(f"_{k.split('_')[0]}-{v}" for k, v in settings.items())
    if args.dense_gemv_backend:  # not in the default file name, which names the FP8 settings
        settings["dense_gemv_backend"] = args.dense_gemv_backend
    out = args.out or str(ROOT / f"benchmarks/results/gpu_decode{suffix}.json")

    bw = gc.copy_bandwidth()
    print(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s (read + write)")
    model_cfg, label = MODELS[args.model]
    model_dir = gc.write_config(model_cfg, args.model)
    configs = args.moe_configs if "num_experts" in model_cfg else [None]
    rows = []
    for backend in args.backends:
        for moe_config in configs:
            extra = {**(moe_bench.MOE_CONFIGS[moe_config] if moe_config else {}), **settings}
            rows += bench_backend(
                model_dir, backend, args.batch_sizes, args.contexts, bw, args.max_total_tokens, model_cfg,
                moe_config, **extra,
            )  # fmt: skip
    faster = faster_backend(rows)
    moe_extra = {}
    if "num_experts" in model_cfg:
        # expert recording's share of the step (same run, same batches), and which few-token GEMV table
        # the fused MoE used (moe/kernels/gemv_table.py: unset = this device's shipped file, if any)
        moe_extra["recording_cost"] = moe_bench.recording_cost(rows)
        moe_extra["moe_gemv_table"] = os.environ.get("TOKENSPEED_MOE_GEMV") or "shipped"
        for key, cost in moe_extra["recording_cost"].items():
            print(f"recording cost {key}: {cost * 100:+.1f}% of the step")
        print(f"moe gemv table: {moe_extra['moe_gemv_table']}")
    if len(args.backends) > 1:
        print("faster backend per context/batch: " + ", ".join(f"{k}={v}" for k, v in faster.items()))
    gc.save_json(
        out,
        dict(
            benchmark="decode",
            model=label,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            device=gc.device_info(),
            copy_bandwidth_tb_s=round(bw / 1e12, 4),
            # programmatic dependent launch of the decode kernels (kernels/pdl.py; on Hopper unless TOKENSPEED_PDL=0)
            pdl=pdl.enabled(torch.device("cuda")),
            faster_backend=faster,
            **moe_extra,
            rows=rows,
        ),
    )


if __name__ == "__main__":
    main()
