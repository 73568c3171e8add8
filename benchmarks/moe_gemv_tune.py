"""`benchmarks/moe_tune.py --gemv`: the few-token MoE GEMV's launch-config sweep, its tuned table, and the
tensor-core path against it per token count (the module docstring of moe_tune.py says what is measured)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks import gpu_common as gc
from benchmarks.moe_tune import INTER, TOP_K, E, H, bench_layers, workload

# gate/up: (block_n, block_k, warps, prefetch, split over K). Weight elements a thread holds a tile = bn *
# bk / (32 * warps), two tiles (gate, up) and two float32 accumulators of that size: 8-32 here. Without a
# split, one token's 8 pairs are 384 programs at bn = 16, each walking K = 2048 in 8 chunks one after
# another; a split shortens that chain (the last split to arrive adds the partials, then SiLU * up), as
# the down kernel's split did (34 -> 27 us a layer at one token, results/gpu_moe_gemv.json).
GATE_UP = [
    (4, 512, 4, 1, 1), (4, 512, 4, 2, 1), (8, 256, 4, 1, 1), (8, 256, 4, 2, 1), (8, 512, 4, 1, 1),
    (16, 256, 4, 1, 1), (16, 256, 8, 2, 1), (16, 512, 8, 1, 1), (32, 256, 8, 1, 1), (4, 256, 2, 2, 1),
    (8, 256, 2, 1, 1), (16, 128, 4, 2, 1), (4, 512, 2, 1, 1),
    (16, 256, 4, 1, 2), (16, 256, 4, 1, 4), (8, 256, 4, 1, 2), (8, 256, 4, 1, 4), (8, 256, 2, 1, 4),
    (16, 128, 4, 2, 4), (8, 256, 4, 0, 8), (16, 256, 4, 0, 8),
]  # fmt: skip
# down: (block_h, block_k, warps, prefetch, split over pairs); K = 768 = 3 x 256. Small block_h fills the
# GPU at one token without atomics; split > 1 fills it with float32 atomics instead. Fewer warps for the
# same tile give each thread more 16-byte loads in flight (compiled for sm_90 on the CPU: every config's
# weight loads are 16-byte vectors, 1-4 a thread per chunk).
DOWN = [
    (2, 256, 1, 2, 1), (4, 256, 1, 2, 1), (4, 256, 2, 2, 1), (8, 256, 2, 2, 1),
    (1, 256, 1, 2, 1), (2, 256, 2, 2, 1), (4, 256, 4, 1, 1), (4, 256, 4, 2, 1), (8, 256, 4, 2, 1),
    (8, 256, 8, 1, 1), (16, 256, 8, 2, 1), (2, 128, 1, 2, 1), (4, 128, 2, 2, 1), (4, 256, 4, 2, 2),
    (8, 256, 4, 2, 2), (16, 256, 4, 2, 4), (16, 256, 8, 1, 8), (32, 256, 8, 2, 8), (8, 256, 4, 1, 8),
]  # fmt: skip


def gate_up_config(base, bn: int, bk: int, warps: int, prefetch: int, split: int):
    return dataclasses.replace(base, block_n=bn, block_k=bk, num_warps=warps, prefetch=prefetch, split=split)


def down_config(base, bh: int, bk: int, warps: int, prefetch: int, split: int):
    return dataclasses.replace(
        base, down_block_h=bh, down_block_k=bk, down_num_warps=warps, down_prefetch=prefetch, down_split=split
    )


def _name(cfg) -> str:
    return (
        f"gu{cfg.block_n}x{cfg.block_k}w{cfg.num_warps}p{cfg.prefetch}s{cfg.split}"
        f"_d{cfg.down_block_h}x{cfg.down_block_k}w{cfg.down_num_warps}p{cfg.down_prefetch}s{cfg.down_split}"
    )


def _checked(cfg, weights, routing, x, arrivals) -> str | None:
    """None if the GEMV's output (its splits merged as timed) matches the tensor-core path's on the first
    layer, else why not."""
    from tokenspeed.runtime.moe.kernels.fused import fused_experts
    from tokenspeed.runtime.moe.kernels.gemv import moe_gemv

    (w13, w2), (tw, ti) = weights[0], routing[0]
    ref = fused_experts(x, w13, w2, tw, ti).float()
    got = moe_gemv(x, w13, w2, tw, ti, cfg, arrivals=arrivals).float()
    err = float((got - ref).norm() / ref.norm())
    return None if err < 2e-2 else f"relative error {err:.3g} against the tensor-core path"


def _arrivals(x: torch.Tensor, cfg) -> torch.Tensor:
    """Arrival counts for `cfg`'s split launches (as `TritonMoe` passes them): their last split adds the
    partials, no atomics, no zeroed buffer."""
    from tokenspeed.runtime.moe.kernels.gemv import arrival_tiles

    n = max(1, arrival_tiles(x.shape[0], TOP_K, INTER, x.shape[1], cfg))
    return torch.zeros(n, dtype=torch.int32, device=x.device)


def _sweep(configs, weights, routing, x) -> dict[str, tuple[float, object]]:
    from tokenspeed.runtime.moe.kernels.gemv import moe_gemv

    out = {}
    for cfg in configs:
        name = _name(cfg)
        arrivals = _arrivals(x, cfg)
        try:
            bad = _checked(cfg, weights, routing, x, arrivals)
            if bad:
                print(f"  {name}: WRONG ({bad}), not timed")
                continue
            out[name] = (
                bench_layers(
                    lambda a, b, c, d, cfg=cfg, r=arrivals: moe_gemv(x, a, b, c, d, cfg, arrivals=r),
                    weights,
                    routing,
                ),  # fmt: skip
                cfg,
            )
        except Exception as e:  # a config that does not compile here is skipped, said so
            print(f"  {name}: skipped ({type(e).__name__}: {str(e)[:100]})")
    return out


def run(weights, tokens: list[int], bw: float, out: str, table_out: str | None, margin: float) -> None:
    from tokenspeed.runtime.moe.kernels import gemv_table
    from tokenspeed.runtime.moe.kernels.configs import pick, table_for
    from tokenspeed.runtime.moe.kernels.fused import fused_experts
    from tokenspeed.runtime.moe.kernels.gemv import MoeGemvConfig, moe_gemv

    device = torch.cuda.get_device_name()
    tc_table = table_for(device)
    key = gemv_table.shape_key(E, INTER, H, torch.bfloat16)
    workloads = {t: workload(t, bw) for t in tokens}
    rows, chosen = [], {}
    for t, (x, routing, limit, touched) in workloads.items():
        tc_cfg = pick(tc_table, t)
        tc_s = bench_layers(
            lambda a, b, c, d, cfg=tc_cfg, x=x: fused_experts(x, a, b, c, d, cfg), weights, routing
        )
        print(f"tokens={t:3d} tensor-core path {tc_s * 1e6:7.1f} us/layer ratio={limit / tc_s:.3f} "
              f"(limit {limit * 1e6:.1f} us, {touched:.0f} experts)")  # fmt: skip
        gu = _sweep([gate_up_config(MoeGemvConfig(), *c) for c in GATE_UP], weights, routing, x)
        if not gu:
            raise SystemExit(f"tokens={t}: no GEMV config ran")
        best_gu = min(gu.values(), key=lambda v: v[0])[1]
        down = _sweep([down_config(best_gu, *c) for c in DOWN], weights, routing, x)
        timed = {**gu, **down}
        best_name = min(timed, key=lambda n: timed[n][0])
        best_s, best_cfg = timed[best_name]
        for name, (s, _) in sorted(timed.items(), key=lambda kv: kv[1][0])[:8]:
            print(f"tokens={t:3d} {name:40s} {s * 1e6:7.1f} us/layer ratio={limit / s:.3f}")
        wins = best_s < tc_s * (1 - margin)
        chosen[t] = best_cfg if wins else None
        print(f"tokens={t:3d} BEST GEMV {best_name} {best_s * 1e6:.1f} us vs tensor-core {tc_s * 1e6:.1f} us: "
              f"{'GEMV' if wins else 'tensor-core'} path")  # fmt: skip
        rows.append(
            dict(
                tokens=t,
                experts_touched=touched,
                limit_us=round(limit * 1e6, 2),
                tensor_core_us=round(tc_s * 1e6, 2),
                tensor_core_ratio=round(limit / tc_s, 4),
                tensor_core_config=asdict(tc_cfg),
                gemv_best=best_name,
                gemv_best_us=round(best_s * 1e6, 2),
                gemv_best_ratio=round(limit / best_s, 4),
                gemv_config=asdict(best_cfg),
                chosen="gemv" if wins else "tensor_core",
                all_gemv_us={n: round(s * 1e6, 2) for n, (s, _) in timed.items()},
            )
        )
    provenance = dict(
        tool="benchmarks/moe_tune.py --gemv", device=gc.device_info(), margin=margin,
        copy_bandwidth_tb_s=round(bw / 1e12, 4), top_k=TOP_K,
    )  # fmt: skip
    path = Path(table_out) if table_out else gemv_table.device_file(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    gc.save_json(str(path), gemv_table.to_json(device, {key: chosen}, provenance))
    # read back through the loader the backend uses; time what it sends each token count to
    table = gemv_table.load_table(path)
    for row in rows:
        t = row["tokens"]
        x, routing, limit, _ = workloads[t]
        cfg = table.pick(E, INTER, H, torch.bfloat16, t)
        if cfg is None:
            tc_cfg = pick(tc_table, t)
            s = bench_layers(
                lambda a, b, c, d, tc_cfg=tc_cfg, x=x: fused_experts(x, a, b, c, d, tc_cfg), weights, routing
            )
        else:
            arrivals = _arrivals(x, cfg)
            gemv = lambda a, b, c, d, cfg=cfg, x=x, r=arrivals: moe_gemv(x, a, b, c, d, cfg, arrivals=r)  # noqa: E731
            s = bench_layers(gemv, weights, routing)
        row.update(table_us=round(s * 1e6, 2), table_ratio=round(limit / s, 4))
        print(f"tokens={t:3d} as tuned ({row['chosen']}): {s * 1e6:.1f} us/layer ratio={limit / s:.3f}")
    gc.save_json(
        out,
        dict(
            benchmark="moe_gemv",
            shape=dict(experts=E, hidden=H, intermediate=INTER, top_k=TOP_K),
            table_file=str(path),
            **provenance,
            rows=rows,
        ),
    )
