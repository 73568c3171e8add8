"""Sizing a fleet against GPU readings before anything starts: weights, memory, KV tokens, graphs.

Per server (all its GPUs hold the same shard, so the smallest GPU decides):

    budget     = total * gpu_memory_utilization      (the seed's default by world size, or the profile's)
                 lowered to (free - margin) / total when other processes already hold memory
    weights    = checkpoint bytes (or parameters from config.json x dtype), sharded by TP / EP
    reserve    = CUDA context + prefill activations + CUDA graphs (estimates, see _reserve_gib)
    KV tokens  = (budget - weights - reserve) / KV bytes per token on one GPU
    concurrent = KV tokens // max_model_len

A plan that leaves no memory for KV, or not enough for one sequence of max_model_len, is refused
with the reason. On a machine without GPUs the only plan is `device = "cpu"`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from console.probe import Probe, probe_gpus
from console.profile_model import ModelShape, find_config, model_shape, weights_bytes

GIB = 1024**3
MARGIN_FRACTION = 0.02  # of total memory, kept free for fragmentation and other processes' growth
MARGIN_MIN_MIB = 1024
KV_DTYPE_BYTES = {
    "auto": None,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
}


def capture_sizes(max_size: int) -> list[int]:
    """Decode batch sizes to capture: 1, 2, 4, then every 8 up to `max_size`."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += list(range(8, max_size + 1, 8))
    if max_size not in sizes and max_size > 0:
        sizes.append(max_size)
    return sizes


@dataclass(frozen=True)
class ServerPlan:
    name: str
    device: str
    gpus: list[int]
    gpu_name: str | None = None
    total_gib: float | None = None
    free_gib: float | None = None
    gpu_memory_utilization: float | None = None
    utilization_default: float | None = None
    weights_gib: float | None = None  # per GPU
    reserve_gib: float | None = None
    kv_gib: float | None = None
    kv_bytes_per_token: int | None = None
    kv_tokens: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    concurrent_seqs: int | None = None
    max_cudagraph_capture_size: int | None = None
    cudagraph_capture_sizes: list[int] = field(default_factory=list)
    fits: bool = True
    reason: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FleetPlan:
    fleet: str
    probe: Probe
    servers: list[ServerPlan]

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.servers)

    @property
    def reason(self) -> str | None:
        bad = [f"{s.name}: {s.reason}" for s in self.servers if not s.fits]
        return "; ".join(bad) or None

    def to_dict(self) -> dict:
        return {
            "fleet": self.fleet,
            "fits": self.fits,
            "reason": self.reason,
            "servers": [asdict(s) for s in self.servers],
        }


def _reserve_gib(shape: ModelShape, args: Any, tp: int, capture: bool) -> float:
    """Memory outside weights and KV: CUDA context, one prefill chunk's activations, captured graphs."""
    context = 0.75
    chunk = int(args.chunked_prefill_size or 8192)
    # hidden states, QKV, MLP intermediate (sharded) of one chunk, in the activation dtype, with room
    # for a few live copies during the forward pass.
    per_token = (4 * shape.hidden + 2 * shape.intermediate_per_gpu(tp)) * shape.dtype_bytes
    activations = chunk * per_token * 4 / GIB
    graphs = 0.5 if capture else 0.0
    return context + activations + graphs


def plan_server(
    name: str, gpus: list[int], args: Any, shape: ModelShape | None, weights: int | None, probe: Probe
) -> ServerPlan:
    max_num_seqs = getattr(args, "max_num_seqs", None)
    if args.device == "cpu":
        return ServerPlan(
            name, "cpu", [], max_num_seqs=max_num_seqs, notes=["CPU: no GPU memory plan, no CUDA graphs"]
        )
    readings = probe.by_index()
    if probe.kind != "nvidia" or not readings:
        return ServerPlan(
            name,
            args.device,
            gpus,
            fits=False,
            reason=(
                f'no NVIDIA GPU on {probe.hostname} ({probe.note or "none found"}); set [server] device = "cpu"'
            ),
        )
    missing = [g for g in gpus if g not in readings]
    if missing:
        return ServerPlan(
            name,
            args.device,
            gpus,
            fits=False,
            reason=f"GPU(s) {missing} not found: {probe.hostname} has GPUs {sorted(readings)}",
        )
    chosen = [readings[g] for g in gpus]
    total = min(g.total_mib for g in chosen)
    free = min(g.free_mib for g in chosen)
    default_util = float(args.gpu_memory_utilization)
    margin = max(MARGIN_MIN_MIB, MARGIN_FRACTION * total)
    notes = []
    util = default_util
    if free - margin < total * util:
        util = max((free - margin) / total, 0.0)
        notes.append(
            f"gpu_memory_utilization lowered from {default_util:.2f} to {util:.2f}: only "
            f"{free / 1024:.1f} GiB of {total / 1024:.1f} GiB free"
        )
    mapping = args.mapping
    capture = not args.enforce_eager
    max_capture = int(args.max_cudagraph_capture_size or 0)
    sizes = list(args.cudagraph_capture_sizes or capture_sizes(min(max_capture, max_num_seqs or max_capture)))
    base = dict(
        name=name,
        device=args.device,
        gpus=gpus,
        gpu_name=chosen[0].name,
        total_gib=total / 1024,
        free_gib=free / 1024,
        gpu_memory_utilization=round(util, 4),
        utilization_default=default_util,
        max_num_seqs=max_num_seqs,
        max_cudagraph_capture_size=max_capture if capture else None,
        cudagraph_capture_sizes=sizes if capture else [],
    )
    if shape is None:
        notes.append("model config.json not found locally: weights and KV not sized")
        return ServerPlan(**base, notes=notes)
    tp = mapping.attn.tp_size
    per_gpu_weights = shape.weights_per_gpu(
        weights, tp, mapping.dense.tp_size, mapping.moe.tp_size * mapping.moe.ep_size
    )
    reserve = _reserve_gib(shape, args, tp, capture)
    budget = total * util / 1024
    kv_gib = budget - per_gpu_weights / GIB - reserve
    kv_dtype = KV_DTYPE_BYTES.get(str(args.kv_cache_dtype)) or shape.dtype_bytes
    per_token = shape.kv_bytes_per_token(tp, kv_dtype)
    max_len = int(args.max_model_len or shape.max_position)
    block = int(args.block_size or 1)
    kv_tokens = max(int(kv_gib * GIB // per_token) // block * block, 0) if kv_gib > 0 else 0
    # Each attention-DP rank has its own KV cache and serves its own sequences.
    dp = mapping.attn.dp_size
    if dp > 1:
        notes.append(f"KV tokens are per attention-DP rank; {dp} ranks serve sequences side by side")
    plan = dict(
        base,
        weights_gib=per_gpu_weights / GIB,
        reserve_gib=reserve,
        kv_gib=max(kv_gib, 0.0),
        kv_bytes_per_token=per_token,
        kv_tokens=kv_tokens,
        max_model_len=max_len,
        concurrent_seqs=(kv_tokens // max_len) * dp if max_len else None,
        notes=notes,
    )
    if kv_gib <= 0:
        return ServerPlan(
            **plan,
            fits=False,
            reason=(
                f"weights {per_gpu_weights / GIB:.1f} GiB + reserve {reserve:.1f} GiB per GPU exceed the "
                f"{budget:.1f} GiB budget (gpu_memory_utilization {util:.2f} of {total / 1024:.1f} GiB); "
                "use more GPUs (tp) or a smaller model"
            ),
        )
    if kv_tokens < max_len:
        return ServerPlan(
            **plan,
            fits=False,
            reason=(
                f"the KV cache holds {kv_tokens} tokens, less than one sequence of max_model_len {max_len}; "
                "lower max_model_len or use more GPUs"
            ),
        )
    return ServerPlan(**plan)


def plan_fleet(resolved, probe: Probe, config: dict | None = None) -> FleetPlan:
    """Plan every server of a resolved profile against `probe` (readings of each node, assumed alike)."""
    args0 = resolved.server_args[0]
    given = config
    models: dict[str, tuple] = {}  # a fleet of server groups may run several models
    servers = []
    for spec, args in zip(resolved.servers, resolved.server_args, strict=False):
        if args.model not in models:
            found = given if given is not None and args.model == args0.model else find_config(args.model)
            shape = model_shape(found) if found else None
            models[args.model] = (shape, weights_bytes(args.model, shape) if shape else None)
        shape, weights = models[args.model]
        servers.append(plan_server(spec.name, list(spec.gpus), args, shape, weights, probe))
    return FleetPlan(resolved.profile.fleet.name, probe, servers)


def plan_with_platform(resolved, probe: Probe, config: dict | None = None):
    """Re-resolve the profile for the probed GPUs (the seed's defaults depend on GPU memory), then plan."""
    from console.profiles import resolve_profile
    from tokenspeed.config.resolve import PlatformFacts

    if probe.kind == "nvidia" and probe.gpus:
        cc = probe.gpus[0].compute_capability
        facts = PlatformFacts(
            "nvidia", bool(cc and tuple(cc) >= (9, 0)), min(g.total_mib for g in probe.gpus) / 1024
        )
        resolved = resolve_profile(resolved.profile, facts)
    return plan_fleet(resolved, probe, config)


def check_fits(resolved, probe: Probe | None = None) -> str | None:
    """None when the fleet fits this machine's GPUs; otherwise why not (nothing should start)."""
    plan = plan_with_platform(resolved, probe or probe_gpus())
    return None if plan.fits else plan.reason


def probe_and_plan(resolved) -> dict:
    probe = probe_gpus()
    try:
        plan = plan_with_platform(resolved, probe).to_dict()
        error = None
    except (ValueError, OSError) as exc:
        plan, error = None, str(exc)
    return {"probe": probe.to_dict(), "plan": plan, "error": error}


def format_plan(plan: FleetPlan) -> str:
    lines = [
        f"fleet {plan.fleet} on {plan.probe.hostname} ({plan.probe.kind}, {len(plan.probe.gpus)} GPU(s))"
    ]
    for s in plan.servers:
        lines.append(f"  {s.name}: device {s.device}" + (f", GPUs {s.gpus} ({s.gpu_name})" if s.gpus else ""))
        if s.total_gib is not None:
            lines.append(
                f"    memory      {s.total_gib:.1f} GiB total, {s.free_gib:.1f} GiB free, "
                f"gpu_memory_utilization {s.gpu_memory_utilization:.2f} (default {s.utilization_default:.2f})"
            )
        if s.weights_gib is not None:
            lines.append(
                f"    weights     {s.weights_gib:.2f} GiB per GPU; reserve {s.reserve_gib:.2f} GiB; "
                f"KV {s.kv_gib:.2f} GiB"
            )
            lines.append(
                f"    KV tokens   {s.kv_tokens} ({s.kv_bytes_per_token} bytes/token/GPU); "
                f"{s.concurrent_seqs} sequences at max_model_len {s.max_model_len}"
            )
        if s.max_cudagraph_capture_size:
            sizes = s.cudagraph_capture_sizes
            shown = ", ".join(map(str, sizes[:6])) + (f", ... {sizes[-1]}" if len(sizes) > 6 else "")
            lines.append(
                f"    CUDA graphs max {s.max_cudagraph_capture_size}: [{shown}] ({len(sizes)} sizes); "
                f"max_num_seqs {s.max_num_seqs}"
            )
        for note in s.notes:
            lines.append(f"    note        {note}")
        lines.append("    fits" if s.fits else f"    REFUSED     {s.reason}")
    return "\n".join(lines)
