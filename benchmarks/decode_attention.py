"""Triton paged decode attention on its own: each stage-1 launch configuration against the bandwidth limit.

For the Llama-3.1-8B and Qwen3-30B-A3B attention shapes (32 query heads over 8 / 4 KV heads, head_dim 128;
a bf16 cache, or an FP8 one with `--kv-dtype fp8_e4m3`) at each batch size and context, every (splits, keys per step, warps, stages) candidate runs
one step's layers replayed from a CUDA graph, cycling through enough layers' K/V that the 50 MB L2 cache
holds none of it (as in a real step). The limit is the K and V bytes over the device-to-device copy
bandwidth measured in the same run; `ratio` = limit / time. Every candidate's output is checked against
the current default's (a candidate that fails to compile or disagrees is reported, never picked).
Writes benchmarks/results/gpu_decode_attention.json.

    python benchmarks/decode_attention.py [--models llama8b qwen3moe] [--batch-sizes 1 16 64 256]
        [--contexts 1024] [--kv-dtype bfloat16|fp8_e4m3] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402

SHAPES = {"llama8b": (32, 8, 128), "qwen3moe": (32, 4, 128)}  # query heads, KV heads, head_dim
PAGE = 64
COLD_BYTES = 512 << 20


def candidates(default_splits: int, max_splits: int) -> list[tuple[int, int, int, int]]:
    """(splits, block_n, num_warps, num_stages) to time: the split count around the default's, and the
    tile and pipeline depths Triton's flash-decoding kernels are usually run with (72 at most a shape; the
    run of 2026-12-04 18:55 UTC timed 32, without 32-key tiles and four stages)."""
    splits = sorted({s for s in (default_splits // 2, default_splits, default_splits * 2, default_splits * 4)
                     if 1 <= s <= max_splits})  # fmt: skip
    return list(itertools.product(splits, (32, 64, 128), (4, 8), (2, 3, 4)))


KV_DTYPES = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def make_case(bs: int, ctx: int, heads: int, kv_heads: int, head_dim: int, layers: int, kv_dtype: torch.dtype,
              seed: int = 0):  # fmt: skip
    """Query rows, `layers` K/V caches and a request->slot table over shuffled pages (a paged cache's order).
    An FP8 cache holds the same normal values cast to e4m3 (a unit scale: the kernel's cost is the same)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_req = -(-ctx // PAGE)
    slots = bs * pages_per_req * PAGE
    order = torch.randperm(bs * pages_per_req, device="cuda", generator=gen)
    page_of = order.view(bs, pages_per_req)
    req_to_token = (page_of[:, :, None] * PAGE + torch.arange(PAGE, device="cuda")).reshape(bs, -1)[:, :ctx]
    req_to_token = req_to_token.to(torch.int32).contiguous()
    kv = [
        (torch.randn(slots, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen).to(kv_dtype),
         torch.randn(slots, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen).to(kv_dtype))
        for _ in range(layers)
    ]  # fmt: skip
    q = torch.randn(bs, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows = torch.arange(bs, device="cuda", dtype=torch.int32)
    lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
    return q, kv, req_to_token, rows, lens


def sweep_case(model: str, bs: int, ctx: int, bw: float, num_sms: int, kv_dtype: torch.dtype) -> dict:
    """Time every candidate at one shape; the row of the results file."""
    from tokenspeed.runtime.kernels.decode_attention import (
        MAX_SPLITS,
        DecodeLaunch,
        decode_attention,
        decode_launch,
        decode_num_splits,
    )

    heads, kv_heads, head_dim = SHAPES[model]
    layer_bytes = 2 * bs * ctx * kv_heads * head_dim * kv_dtype.itemsize
    layers = max(2, -(-COLD_BYTES // layer_bytes))
    q, kv, table, rows, lens = make_case(bs, ctx, heads, kv_heads, head_dim, layers, kv_dtype)
    out, reference = torch.empty_like(q), torch.empty_like(q)
    default_splits = decode_num_splits(bs, kv_heads, num_sms)
    cands = candidates(default_splits, MAX_SPLITS * 2)
    max_split = max(c[0] for c in cands)
    mid_o = torch.empty(bs, heads, max_split, head_dim, device="cuda", dtype=torch.float32)
    mid_lse = torch.empty(bs, heads, max_split, device="cuda", dtype=torch.float32)
    scale = head_dim**-0.5

    arrivals = torch.zeros(bs * kv_heads, device="cuda", dtype=torch.int32)

    def call(splits: int, launch: DecodeLaunch, layer: int, dst: torch.Tensor = out) -> None:
        k, v = kv[layer]
        decode_attention(q, k, v, dst, table, rows, lens, mid_o, mid_lse, scale, splits, launch=launch,
                         arrivals=arrivals)  # fmt: skip

    base = decode_launch(head_dim, False, bs * kv_heads * default_splits, num_sms, kv_dtype.itemsize)
    call(default_splits, base, 0, reference)
    limit_s = layer_bytes / bw
    timed = []
    for splits, block_n, warps, stages in cands:
        launch = DecodeLaunch(block_n, warps, stages)
        try:
            call(splits, launch, 0)
            torch.cuda.synchronize()
            err = float((out.float() - reference.float()).abs().max())
            if err > 2e-2:
                raise ValueError(f"max abs difference {err:.3g} from the default's output")
            seconds = gc.graph_seconds(
                [lambda i=i, s=splits, la=launch: call(s, la, i) for i in range(layers)]
            )
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is reported and skipped
            print(
                f"  {model} bs={bs} ctx={ctx} {splits} {launch}: skipped ({str(exc).splitlines()[0][:120]})"
            )
            continue
        row = dict(splits=splits, block_n=block_n, num_warps=warps, num_stages=stages, us=round(seconds * 1e6, 2),
                   ratio=round(limit_s / seconds, 4), default=splits == default_splits and launch == base)  # fmt: skip
        timed.append(row)
    timed.sort(key=lambda r: r["us"])
    default_row = next((r for r in timed if r["default"]), None)
    best = timed[0]
    # the default configuration in one launch (its last split merges): what TOKENSPEED_DECODE_ONE_LAUNCH=1 runs
    one = dataclasses.replace(base, one_launch=True)
    call(default_splits, one, 0)
    torch.cuda.synchronize()
    one_err = float((out.float() - reference.float()).abs().max())
    one_s = gc.graph_seconds([lambda i=i: call(default_splits, one, i) for i in range(layers)])
    one_row = dict(us=round(one_s * 1e6, 2), ratio=round(limit_s / one_s, 4), max_abs_diff=round(one_err, 5),
                   speedup=round(default_row["us"] / (one_s * 1e6), 4) if default_row else None)  # fmt: skip
    print(f"  one launch (default config): {one_row}")
    print(f"{model} {str(kv_dtype)[6:]} bs={bs} ctx={ctx}: KV {layer_bytes / 1e6:.1f} MB a layer, limit {limit_s * 1e6:.1f} us; "
          f"default {default_row['us'] if default_row else '-'} us "
          f"({default_row['ratio'] if default_row else '-'}); best {best['us']} us ({best['ratio']:.3f}) "
          f"splits={best['splits']} block_n={best['block_n']} warps={best['num_warps']} stages={best['num_stages']}",
          flush=True)  # fmt: skip
    for r in timed[:5]:
        print(f"    {r}")
    return dict(model=model, kv_dtype=str(kv_dtype)[6:], batch=bs, context=ctx, kv_heads=kv_heads, heads=heads, head_dim=head_dim,
                layer_kv_mb=round(layer_bytes / 1e6, 2), limit_us=round(limit_s * 1e6, 2),
                default_splits=default_splits, default=default_row, best=best, one_launch=one_row,
                candidates=timed)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen3moe", "llama8b"], choices=list(SHAPES))
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--contexts", nargs="+", type=int, default=[1024])
    ap.add_argument("--kv-dtype", default="bfloat16", choices=list(KV_DTYPES))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_decode_attention.json"))
    args = ap.parse_args()

    bw = gc.copy_bandwidth()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, {num_sms} SMs", flush=True)
    results = []
    for model, bs, ctx in itertools.product(args.models, args.batch_sizes, args.contexts):
        results.append(sweep_case(model, bs, ctx, bw, num_sms, KV_DTYPES[args.kv_dtype]))
        gc.gc_collect_cuda()
        # written after each shape, so a run cut short by its time limit keeps what it measured
        gc.save_run(args.out, "decode_attention", ", ".join(args.models), copy_bandwidth_tb_s=round(bw / 1e12, 3),
                    num_sms=num_sms, kv_dtype=args.kv_dtype, rows=results)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
