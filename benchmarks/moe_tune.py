"""Block sizes of the fused MoE kernels per batch size on this GPU (the table in moe/kernels/configs.py).

For each token count, every candidate config runs the experts of 8 layers of the Qwen3-30B-A3B shape
(128 experts, hidden 2048, intermediate 768, top-8, bf16, uniform random routing; 8 separate weight
sets, ~10 GB, so nothing is served from L2) inside one CUDA graph, timed over replays. Reported: time
per layer, the bytes of the experts the routing touched over that time, and the best config per token
count next to the one the table picks. Writes benchmarks/results/gpu_moe_tune.json.

    python benchmarks/moe_tune.py [--tokens 1 2 4 8 16 32 64 128 256]

`--gemv` instead sweeps the CUDA-core GEMV of few-token steps (`moe/kernels/gemv.py`) at each token count
(default 1 2 4 8 16): gate/up launch configs with a fixed down one, then down configs (split over pairs
or not) with the best gate/up, each checked against the tensor-core path's output first. Per token count
it reports the tensor-core path as the table picks it and the best GEMV, each per layer with the share of
the bandwidth limit (bytes of the routed experts over the copy bandwidth), and writes the tuned table
(`moe/kernels/gemv_table.py`: the GEMV where it beats the tensor-core path by more than --margin, else
null) to --table-out (default: the shipped file of this device), then times each token count again as
that table, read back through the loader, sends it. Results to benchmarks/results/gpu_moe_gemv.json.

    python benchmarks/moe_tune.py --gemv [--tokens 1 2 4 8 16] [--table-out PATH]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402

E, H, INTER, TOP_K, LAYERS = 128, 2048, 768, 8, 8
EXPERT_BYTES = 3 * H * INTER * 2
DEFAULT_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def workload(tokens: int, bw: float):
    """x, one uniform random routing per layer, the bandwidth limit of a layer (s) and experts touched."""
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    routing = []
    for _ in range(LAYERS):
        logits = torch.randn(tokens, E, device="cuda")
        w, i = torch.softmax(logits, -1).topk(TOP_K, -1)
        routing.append(((w / w.sum(-1, keepdim=True)).float(), i.to(torch.int32)))
    touched = sum(int(i.unique().numel()) for _, i in routing) / LAYERS
    return x, routing, touched * EXPERT_BYTES / bw, touched


def candidates():
    from tokenspeed.runtime.moe.kernels.configs import MoeKernelConfig as C

    out = {
        "p16n16k128": C(pairs=True, block_n=16, block_k=128, down_block_n=32, down_block_k=128),
        "p16n32k128": C(pairs=True, block_n=32, block_k=128, down_block_n=64, down_block_k=128),
        "p16n32k256": C(pairs=True, block_n=32, block_k=256, down_block_n=64, down_block_k=256, num_stages=2),
        "p16n64k128": C(pairs=True, block_n=64, block_k=128, down_block_n=64, down_block_k=128),
        "m16n32k128": C(block_m=16, block_n=32, block_k=128, down_block_n=64, down_block_k=128),
        "m16n64k128": C(block_m=16, block_n=64, block_k=128, down_block_n=64, down_block_k=128),
        "m16n128k128": C(
            block_m=16, block_n=128, block_k=128, down_block_n=128, down_block_k=128, num_stages=2
        ),
        "m32n64k128": C(block_m=32, block_n=64, block_k=128, down_block_n=128, down_block_k=128),
        "m64n64k64": C(block_m=64, block_n=64, block_k=64, down_block_n=128, down_block_k=64),
    }
    return out


def bench(cfg, tokens: int, weights, x, routing) -> float:
    from tokenspeed.runtime.moe.kernels.fused import fused_experts

    return bench_layers(lambda w13, w2, tw, ti: fused_experts(x, w13, w2, tw, ti, cfg), weights, routing)


def bench_layers(layer, weights, routing) -> float:
    """Seconds a layer of `layer(w13, w2, weights, ids)` over the LAYERS weight sets, replayed in a graph."""

    def layers():
        for (w13, w2), (tw, ti) in zip(weights, routing, strict=True):
            layer(w13, w2, tw, ti)

    layers()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()
    return gc.time_cuda(graph.replay, iters=20, warmup=3) / LAYERS


def main() -> None:
    from tokenspeed.runtime.moe.kernels.configs import pick, table_for

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", nargs="+", type=int, default=DEFAULT_TOKENS)
    ap.add_argument(
        "--out",
        default=None,
        help="default: benchmarks/results/gpu_moe_tune.json (--gemv: gpu_moe_gemv.json)",
    )
    ap.add_argument("--gemv", action="store_true", help="sweep the few-token GEMV path and write its table")
    ap.add_argument(
        "--table-out", default=None, help="--gemv: the tuned table (default: this device's shipped file)"
    )
    ap.add_argument("--margin", type=float, default=0.03, help="--gemv: how much faster the GEMV must be")
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = gc.copy_bandwidth()
    print(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s")
    weights = [
        (
            torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16) * 0.02,
            torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16) * 0.02,
        )
        for _ in range(LAYERS)
    ]
    if args.gemv:
        from benchmarks import moe_gemv_tune

        tokens = args.tokens if args.tokens != DEFAULT_TOKENS else [1, 2, 4, 8, 16]
        out = args.out or str(ROOT / "benchmarks/results/gpu_moe_gemv.json")
        moe_gemv_tune.run(weights, tokens, bw, out, args.table_out, args.margin)
        return
    table = table_for(torch.cuda.get_device_name())
    cands = candidates()
    rows = []
    for t in args.tokens:
        x, routing, limit, touched = workload(t, bw)
        results = {}
        for name, cfg in cands.items():
            if cfg.pairs and t > 32:
                continue
            try:
                results[name] = bench(cfg, t, weights, x, routing)
            except Exception as e:  # a config that does not compile here (shared memory) is skipped
                print(f"tokens={t} {name}: skipped ({type(e).__name__}: {str(e)[:80]})")
        best = min(results, key=results.get)
        chosen = pick(table, t)
        table_s = bench(chosen, t, weights, x, routing)
        for name, s in sorted(results.items(), key=lambda kv: kv[1]):
            print(f"tokens={t:4d} {name:14s} {s * 1e6:8.1f} us/layer  ratio={limit / s:.3f}")
        print(
            f"tokens={t:4d} BEST {best} {results[best] * 1e6:.1f} us; table {table_s * 1e6:.1f} us "
            f"(limit {limit * 1e6:.1f} us, {touched:.0f} experts)"
        )
        rows.append(
            dict(
                tokens=t,
                experts_touched=touched,
                limit_us=round(limit * 1e6, 2),
                best=best,
                best_us=round(results[best] * 1e6, 2),
                table_us=round(table_s * 1e6, 2),
                table_config=asdict(chosen),
                all_us={k: round(v * 1e6, 2) for k, v in results.items()},
            )
        )
    gc.save_json(
        args.out or str(ROOT / "benchmarks/results/gpu_moe_tune.json"),
        dict(
            benchmark="moe_tune",
            shape=dict(experts=E, hidden=H, intermediate=INTER, top_k=TOP_K),
            device=gc.device_info(),
            copy_bandwidth_tb_s=round(bw / 1e12, 4),
            candidates={k: asdict(v) for k, v in cands.items()},
            rows=rows,
        ),
    )


if __name__ == "__main__":
    main()
