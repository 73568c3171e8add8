"""MoE pieces of the GPU benchmarks: the configurations compared, an engine core that manages experts
(recording, EPLB) as `tokenspeed serve` does, and the kernel count of one MoE layer."""

from __future__ import annotations

from typing import Any

import torch

# name -> server args on top of the benchmark's own; "default" is what a user gets without MoE flags
MOE_CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "record": {"enable_expert_distribution_metrics": True},  # stat recording kept on, metrics exported
    "triton": {"moe_backend": "triton"},
    "eplb": {"ep_num_redundant_experts": 8, "enable_eplb": True, "eplb_rebalance_num_iterations": 100},
    "torch": {"moe_backend": "torch"},  # the reference: its expert loop syncs, so it decodes eagerly
}


def recording_cost(rows: list[dict]) -> dict[str, float]:
    """Per "backend/context/batch" timed both ways in one run: the step time with expert recording on
    (`record`) over the step without (`default`), minus one (0.05 = recording costs 5% of the step).
    Graph-replay rows only (eager rows and skipped ones carry no comparable step)."""
    steps: dict[tuple[str, str], float] = {}
    for r in rows:
        if r.get("eager") or "step_ms" not in r or r.get("moe_config") not in ("default", "record"):
            continue
        steps[(f"{r['backend']}/{r['context']}/{r['batch']}", r["moe_config"])] = r["step_ms"]
    return {
        key: round(steps[(key, "record")] / base - 1, 4)
        for (key, cfg), base in steps.items()
        if cfg == "default" and (key, "record") in steps
    }


def make_core(model_dir: str, **server_args: Any):
    """An EngineCore on dummy bf16 weights; with expert flags, the rank engine `serve` builds (recorder,
    EPLB, redundant slots) in this process."""
    from tokenspeed.config.server_args import ServerArgs
    from tokenspeed.runtime.distributed.rank_engine import build_rank_engine, needs_group_peers
    from tokenspeed.runtime.engine.engine_core import EngineCore

    args = dict(load_format="dummy", dtype="bfloat16", device="cuda", skip_tokenizer_init=True)
    args.update(server_args)
    sa = ServerArgs(model=model_dir, **args)
    return build_rank_engine(sa, 0, 0, None, 0) if needs_group_peers(sa) else EngineCore(sa)


def moe_layer_kernels(runner, fb) -> dict[str, int]:
    """Kernels one MoE layer launches for `fb`'s tokens: with the backend in use and with the torch
    reference (the default before the fused path was), gate linear included."""
    from benchmarks.kernel_profile import profile_step
    from tokenspeed.runtime.moe.backend import TorchMoe, UsesMoeBackend

    block = next(m for m in runner.model.modules() if isinstance(m, UsesMoeBackend))
    hidden = runner.model_config.hidden_size
    x = torch.randn(fb.num_tokens, hidden, device="cuda", dtype=runner.model_config.dtype)
    fused = block.backend
    out = {}
    with torch.inference_mode():
        out[fused.name] = profile_step(lambda: block(x, fb))["kernels"]
        block.backend = TorchMoe()
        try:
            out["torch_reference"] = profile_step(lambda: block(x, fb))["kernels"]
        finally:
            block.backend = fused
    return out
