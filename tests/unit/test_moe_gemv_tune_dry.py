"""`benchmarks/moe_tune.py --gemv`'s decisions on the CPU, with the kernels replaced by the reference loop and
the timer by fixed times: a GEMV config that is wrong is never timed, the GEMV is written into the table
only where it beats the tensor-core path by the margin, and the table read back through the loader sends
each token count where the sweep said."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

import benchmarks.moe_gemv_tune as tune  # noqa: E402
from benchmarks import gpu_common  # noqa: E402
from tokenspeed.runtime.moe.backend import torch_experts  # noqa: E402
from tokenspeed.runtime.moe.kernels import fused, gemv, gemv_table  # noqa: E402

E, H, INTER, TOP_K = 8, 64, 32, 2
FAST = (8, 256, 4, 2, 1)  # the down config the fake timer makes fastest
BROKEN = (4, 256, 4, 2, 2)  # a config whose (fake) kernel returns wrong numbers


def test_sweep_writes_the_winning_gemv_and_null_elsewhere(tmp_path, monkeypatch):
    ran: list = []

    def fake_gemv(x, w13, w2, tw, ti, cfg, scales=None, arrivals=None):
        # the sweep times split configurations merged by arrival, as TritonMoe runs them
        assert arrivals is None or (arrivals.dtype == torch.int32 and not arrivals.any())
        ran.append(cfg)
        out = torch_experts(x, w13, w2, tw, ti)
        broken = (cfg.down_block_h, cfg.down_block_k, cfg.down_num_warps, cfg.down_prefetch, cfg.down_split)
        return out * 3 if broken == BROKEN else out

    def fake_fused(x, w13, w2, tw, ti, cfg=None, scales=None):
        ran.append("tensor_core")
        return torch_experts(x, w13, w2, tw, ti)

    def fake_time(layer, weights, routing):
        (w13, w2), (tw, ti) = weights[0], routing[0]
        layer(w13, w2, tw, ti)
        what, tokens = ran[-1], tw.shape[0]
        if what == "tensor_core":
            return 20e-6
        fast = (what.down_block_h, what.down_block_k, what.down_num_warps, what.down_prefetch) == FAST[:4]
        # one token: the fast down config beats the tensor cores; two tokens: 2% faster, inside the margin
        return (10e-6 if tokens == 1 else 19.6e-6) if fast else 40e-6

    def workload(tokens, bw):
        x = torch.randn(tokens, H)
        w, i = torch.softmax(torch.randn(tokens, E), -1).topk(TOP_K, -1)
        return x, [(w.float(), i.to(torch.int32))], 10e-6, 3.0

    monkeypatch.setattr(gemv, "moe_gemv", fake_gemv)
    monkeypatch.setattr(fused, "fused_experts", fake_fused)
    monkeypatch.setattr(tune, "bench_layers", fake_time)
    monkeypatch.setattr(tune, "workload", workload)
    monkeypatch.setattr(gpu_common, "device_info", lambda: {"gpu": "dry run"})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    for name, value in dict(E=E, H=H, INTER=INTER, TOP_K=TOP_K).items():
        monkeypatch.setattr(tune, name, value)
    weights = [(torch.randn(E, 2 * INTER, H) * 0.05, torch.randn(E, H, INTER) * 0.05)]
    out, table_path = tmp_path / "gemv.json", tmp_path / "NVIDIA_H200.json"
    tune.run(weights, [1, 2], 4e12, str(out), str(table_path), margin=0.03)

    broken = [c for c in ran if c != "tensor_core" and (c.down_block_h, c.down_split) == (4, 2)]
    assert len(broken) == 2  # checked at each token count, never timed (a timed call would make a third)
    table = gemv_table.load_table(table_path)
    picked = table.pick(E, INTER, H, torch.bfloat16, 1)
    assert picked is not None and (picked.down_block_h, picked.down_num_warps, picked.down_prefetch) == (
        8,
        4,
        2,
    )
    assert table.pick(E, INTER, H, torch.bfloat16, 2) is None  # within the margin: the tensor-core path
    rows = {r["tokens"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[1]["chosen"] == "gemv" and rows[2]["chosen"] == "tensor_core"
    assert rows[1]["tensor_core_ratio"] == 0.5 and rows[1]["gemv_best_ratio"] == 1.0
    assert rows[1]["table_us"] == 10.0 and rows[2]["table_us"] == 20.0  # timed as the loader sends them
