"""Multi-process runs of sharded tiny models over gloo on 127.0.0.1, compared with one process.

`run_ranks(world_size, cases, out_dir)` spawns `world_size` processes; each joins one gloo world, then
for every case builds that case's groups, loads the tiny model sharded for its rank, runs the same steps
through a `PagedHarness` and saves its logits (rank 0) to `out_dir/<case>.pt`. `reference_logits`
runs the same steps with the unsharded model in this process.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import traceback
from pathlib import Path
from typing import Any

import torch

# prefill of three prompts in one step, then decodes, then a chunk beside a decode
PROMPTS = {"a": [11, 12, 13, 14, 15], "b": list(range(40, 57)), "c": [(7 * i) % 300 + 5 for i in range(23)]}
NUM_DECODES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model_path: str
    mapping: dict[str, int]  # Mapping fields besides world_size
    moe: dict[str, Any] = dataclasses.field(default_factory=dict)  # ExpertPlan fields
    record: bool = False  # record the expert distribution (saved next to the logits)
    rebalance_after: int | None = None  # live EPLB rebalance after this step (needs record)
    quantization: str | None = None  # --quantization (fp8: each rank quantizes its shard at load)


def run_steps(model, config, recorder=None, between=None) -> list[torch.Tensor]:
    """Logits of every step of a fixed schedule (greedy tokens fed back); `between(i)` after step i."""
    from tests.tiny_models import PagedHarness

    harness = PagedHarness(model, config)
    seqs = {rid: list(ids) for rid, ids in PROMPTS.items()}
    out = []

    def step(items):
        logits = harness.step(items, recorder)
        if recorder is not None:
            recorder.end_pass()
        out.append(logits)
        if between is not None:
            between(len(out) - 1)
        return logits

    logits = step([(rid, ids[:-4] if rid == "c" else ids) for rid, ids in seqs.items()])
    logits = step([("a", [int(logits[0].argmax())]), ("c", seqs["c"][-4:])])
    nxt = {"a": int(logits[0].argmax()), "c": int(logits[1].argmax())}
    for _ in range(NUM_DECODES):
        logits = step([(rid, [tok]) for rid, tok in nxt.items()])
        nxt = {rid: int(logits[i].argmax()) for i, rid in enumerate(nxt)}
    return out


def reference_logits(model_path: str) -> list[torch.Tensor]:
    from tokenspeed.runtime.models.loader import load_model
    from tokenspeed.runtime.models.model_config import ModelConfig

    config = ModelConfig.from_pretrained(model_path)
    with torch.no_grad():
        return run_steps(load_model(config, "auto", "cpu"), config)


def _run_case(case: Case, rank: int, world_size: int, out_dir: Path) -> None:
    from tokenspeed.config.slices import ExpertPlan
    from tokenspeed.runtime.distributed.groups import build_groups
    from tokenspeed.runtime.distributed.mapping import Mapping
    from tokenspeed.runtime.distributed.tensor_parallel import load_parallel_model, local_kv_heads
    from tokenspeed.runtime.models.model_config import ModelConfig
    from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder

    mapping = Mapping(world_size=world_size, **case.mapping)
    groups = build_groups(mapping, rank, "gloo")
    config = ModelConfig.from_pretrained(case.model_path, quantization=case.quantization)
    pm = load_parallel_model(config, groups, moe=ExpertPlan(**case.moe))
    local = dataclasses.replace(config, num_kv_heads=local_kv_heads(config.num_kv_heads, groups.attn_tp.size))
    recorder = None
    if case.record:
        slots = pm.expert_state.location.num_physical if pm.expert_state else config.num_experts
        recorder = ExpertDistributionRecorder("stat", config.num_layers, slots, kept_by="test")
    manager, rebalances = None, []
    if case.rebalance_after is not None:
        from tokenspeed.runtime.moe.eplb_manager import EPLBManager

        manager = EPLBManager(pm.expert_state, recorder, case.moe.get("num_redundant_experts", 0))
        phy2log_before = pm.expert_state.location.placement.phy2log.clone()

    def between(i: int) -> None:
        if manager is not None and i == case.rebalance_after:
            counts = recorder.window_counts()
            rebalances.append({"result": manager.rebalance(), "counts": counts, "before": phy2log_before})

    with torch.no_grad():
        logits = run_steps(pm.model, local, recorder, between)
    if groups.attn_tp.is_first:
        # every attention-DP replica ran the same steps: each group's first rank must match
        torch.save(logits, out_dir / f"{case.name}.rank{rank}.logits.pt")
    if rank == 0:
        result = {"logits": logits}
        if recorder is not None:
            result["counts"] = recorder.window_counts()
            result["phy2log"] = pm.expert_state.location.placement.phy2log if pm.expert_state else None
        result["rebalances"] = [{**r, "result": dataclasses.asdict(r["result"])} for r in rebalances]
        torch.save(result, out_dir / f"{case.name}.pt")


def _worker(rank: int, world_size: int, port: int, cases: list[Case], out_dir: str) -> None:
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world_size, rank=rank)
    try:
        for case in cases:
            try:
                _run_case(case, rank, world_size, Path(out_dir))
            except Exception:
                (Path(out_dir) / f"{case.name}.rank{rank}.error").write_text(traceback.format_exc())
                raise
    finally:
        dist.destroy_process_group()


def run_ranks(world_size: int, cases: list[Case], out_dir: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world_size, free_port(), cases, str(out_dir)), nprocs=world_size, join=True)
