"""Serving on the GPU against the offline engine, in one run: the figures of a deployed Llama-3.1-8B server.

Llama-3.1-8B shape, dummy bf16 weights, a word-level tokenizer over the whole vocabulary
(`benchmarks/dummy_model.py`: every token streams as text, so time between text chunks is time between
tokens). For each attention backend, one `tokenspeed serve` is started and timed to READY (the process
start to /health answering, warm-up done), then `tokenspeed bench serving` runs the same random prompts
(input --input-len, output --output-len, EOS ignored) at concurrency 1 and at --concurrency. Then the
offline Engine, with the same engine flags, runs the same high-concurrency workload, a single prompt's
prefill (max_new_tokens 1, median of 5) and one request alone (its TPOT). Printed and written:

    serving <backend> c=1:   out tok/s, TTFT p50, ITL p50, TPOT p50
    serving <backend> c=256: out tok/s, TTFT p50/p99
    offline: out tok/s at the same load, prefill of one prompt, TPOT of one request
    goals: HTTP out tok/s >= 90% of offline at high concurrency; at concurrency 1 (32 requests)
    TTFT p50 <= 1.5 x the engine's prefill of the same prompt and ITL p50 <= 1.3 x TPOT

    python benchmarks/serving_gpu.py [--backends triton flashinfer] [--num-prompts 400] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks.dummy_model import write_model_folder  # noqa: E402
from benchmarks.startup_log import print_phases  # noqa: E402
from tokenspeed import bench_serving  # noqa: E402

TOKEN_IDS = "1000,120000"


def engine_flags(args) -> dict:
    """The engine configuration both the servers and the offline engine run with."""
    return dict(
        device=args.device,
        load_format="dummy",
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_model_len=args.input_len + args.output_len + 64,
        max_num_seqs=args.concurrency,
        # a coarser ladder than the default one to --concurrency: fewer graphs to capture at start-up
        cudagraph_capture_sizes=[
            s for s in (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256) if s < args.concurrency
        ]
        + [args.concurrency],
    )


def _cli(flags: dict) -> list[str]:
    out = []
    for k, v in flags.items():
        out += [f"--{k.replace('_', '-')}", *(map(str, v) if isinstance(v, list) else [str(v)])]
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, backend: str, args, log: Path) -> tuple[subprocess.Popen, str, float]:
    port = _free_port()
    cmd = [sys.executable, "-m", "tokenspeed", "serve", model, "--attention-backend", backend,
           "--port", str(port), "--served-model-name", "llama8b", *_cli(engine_flags(args))]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{backend} server exited with {proc.returncode}; its log ends:\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, time.monotonic() - started
        except httpx.HTTPError:
            pass
        if time.monotonic() - started > args.start_timeout:
            proc.kill()
            raise RuntimeError(f"{backend} server not READY in {args.start_timeout} s; see {log}")
        time.sleep(0.25)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench(url: str, conc: int, num_prompts: int, args, tmp: Path) -> dict:
    out = tmp / f"bench_{conc}.json"
    argv = ["--base-url", url, "--num-prompts", str(num_prompts), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--max-concurrency", str(conc), "--token-id-range", TOKEN_IDS,
            "--warmup-requests", "2", "--seed", "0", "--output", str(out)]  # fmt: skip
    rc = bench_serving.main(argv)
    import json

    run = json.loads(out.read_text())["runs"][0]
    run["exit_code"] = rc
    return run


def _row(run: dict) -> dict:
    return dict(
        out_tok_s=round(run["output_token_throughput"], 1),
        ttft_p50_ms=run["ttft"]["p50_ms"],
        ttft_p99_ms=run["ttft"]["p99_ms"],
        itl_p50_ms=run["itl"]["p50_ms"],
        tpot_p50_ms=run["tpot"]["p50_ms"],
        completed=run["completed"],
        failed=run["failed"],
    )


def offline(model: str, backend: str, args) -> dict:
    import random

    import torch

    from tokenspeed import Engine

    rng = random.Random(0)
    lo, hi = (int(x) for x in TOKEN_IDS.split(","))
    prompts = [[rng.randrange(lo, hi) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    # Prompts of their own for the warm-up and the single-request timings: none is in the prefix cache.
    probes = [[rng.randrange(lo, hi) for _ in range(args.input_len)] for _ in range(10)]
    params = {"max_new_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}
    started = time.monotonic()
    with Engine(model=model, attention_backend=backend, **engine_flags(args)) as engine:
        ready_s = time.monotonic() - started
        engine.generate(input_ids=probes[:4], sampling_params={**params, "max_new_tokens": 4})  # warm-up
        prefill = []
        for p in probes[4:9]:
            t = time.perf_counter()
            engine.generate(input_ids=[p], sampling_params={**params, "max_new_tokens": 1})
            prefill.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.generate(input_ids=[probes[9]], sampling_params=params)
        alone = time.perf_counter() - t
        t = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - t
    if torch.cuda.is_available():
        gc.gc_collect_cuda()
    tokens = sum(len(o["output_ids"]) for o in outs)
    prefill_ms = statistics.median(prefill) * 1e3
    return dict(
        backend=backend,
        ready_s=round(ready_s, 1),
        requests=len(prompts),
        out_tok_s=round(tokens / elapsed, 1),
        prefill_ms=round(prefill_ms, 2),
        tpot_ms=round((alone * 1e3 - prefill_ms) / (args.output_len - 1), 3),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["triton", "flashinfer"])
    ap.add_argument("--offline-backend", default="triton", help="attention backend of the offline engine")
    ap.add_argument("--num-prompts", type=int, default=400)
    ap.add_argument(
        "--c1-prompts", type=int, default=32, help="requests of the concurrency-1 run (p50s of >= 32)"
    )
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_serving.json"))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script on a tiny model")
    args = ap.parse_args()
    shape = gc.LLAMA_8B
    if args.device == "cpu":  # the same code path on a model the CPU runs in seconds
        shape = dict(shape, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip

    tmp = Path(tempfile.mkdtemp(prefix="tokenspeed-serving-gpu-"))
    model = write_model_folder(shape, tmp / "llama-3.1-8b-dummy")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    serving = {}
    for backend in args.backends:
        proc, url, ready_s = start_server(model, backend, args, tmp / f"serve_{backend}.log")
        print(f"serving {backend}: READY in {ready_s:.1f} s")
        print_phases(tmp / f"serve_{backend}.log", f"serving {backend} start-up")
        try:
            c1 = _row(bench(url, 1, args.c1_prompts, args, tmp))
            print(f"serving {backend} c=1: {c1}")
            cn = _row(bench(url, args.concurrency, args.num_prompts, args, tmp))
            print(f"serving {backend} c={args.concurrency}: {cn}")
        finally:
            stop_server(proc)
        serving[backend] = {"ready_s": round(ready_s, 1), "c1": c1, f"c{args.concurrency}": cn}
    off = offline(model, args.offline_backend, args)
    print(f"offline {args.offline_backend}: {off}")
    goals = {}
    if args.offline_backend in serving:
        s = serving[args.offline_backend]
        cn, c1 = s[f"c{args.concurrency}"], s["c1"]
        goals = {
            "http_vs_offline_throughput": round(cn["out_tok_s"] / off["out_tok_s"], 3),
            "http_vs_offline_goal": 0.9,
            "ttft_c1_ms": c1["ttft_p50_ms"],
            "ttft_c1_goal_ms": round(1.5 * off["prefill_ms"], 2),
            "itl_over_tpot_c1": round(c1["itl_p50_ms"] / c1["tpot_p50_ms"], 3) if c1["tpot_p50_ms"] else None,
            "itl_over_tpot_goal": 1.3,
            # `tokenspeed serve` to READY with the kernel caches warm (tests/gpu/cache/ carries them to a
            # fresh machine); the server's log phases are printed above
            "ready_s": s["ready_s"],
            "ready_goal_s": 30.0,
        }
        print(f"goals ({args.offline_backend}): {goals}")
    if "triton" in serving and "flashinfer" in serving:
        ratio = serving["flashinfer"]["ready_s"] / serving["triton"]["ready_s"]
        goals["flashinfer_over_triton_ready"] = round(ratio, 3)
        goals["flashinfer_over_triton_ready_goal"] = 1.3
        print(f"goal: flashinfer READY / triton READY = {ratio:.2f} (<= 1.3)")
    gc.save_json(
        args.out,
        dict(
            benchmark="serving_gpu",
            model="Llama-3.1-8B shape, dummy bf16 weights, word-level tokenizer over the vocabulary",
            device=gc.device_info() if args.device == "cuda" else {"device": "cpu"},
            workload=dict(
                input_len=args.input_len,
                output_len=args.output_len,
                num_prompts=args.num_prompts,
                concurrency=args.concurrency,
                c1_prompts=args.c1_prompts,
            ),  # fmt: skip
            engine_flags=engine_flags(args),
            serving=serving,
            offline=off,
            goals=goals,
        ),
    )


if __name__ == "__main__":
    main()
