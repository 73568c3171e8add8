"""Sizing a fleet against GPU readings before anything starts, through the server's own memory model.

Per server (all its GPUs hold the same shard, so the smallest and fullest GPU decides), with the
formulas of `tokenspeed.config.memory_model` that the server's KV sizing runs:

    free       = NVML free memory, plus what this fleet's own servers hold (a plan for a running fleet
                 is the plan of its restart, never refused for its own memory)
    weights    = parameters from config.json x dtype (scaled to the checkpoint's size), sharded by TP / EP
    reserve    = CUDA context + request table + CUDA-graph pool (+ FlashInfer workspace)
    KV budget  = free - weights - reserve - total * (1 - gpu_memory_utilization)
    KV tokens  = KV budget // (KV bytes per token * block_size) * block_size
    concurrent = KV tokens // max_model_len

The plan is applied: `planned_flags` are put on each server's command line (the utilization and the
capture sizes), so the server sizes with the same inputs. A plan that leaves no memory for KV, or not
enough for one sequence of max_model_len, is refused with the reason. On a machine without GPUs the only
plan is `device = "cpu"`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from console.probe import Probe, probe_gpus
from console.profile.model import checkpoint_bytes, find_config
from tokenspeed.config import memory_model as mm
from tokenspeed.config.model_shape import ModelShape, model_shape

if TYPE_CHECKING:
    from console.gpu_owners import FleetProcesses

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class ServerPlan:
    name: str
    device: str
    gpus: list[int]
    gpu_name: str | None = None
    total_gib: float | None = None
    free_gib: float | None = None  # what the plan counts as free: NVML's free plus the fleet's own
    own_gib: float | None = None  # held by this fleet's own servers on the fullest GPU (added back)
    others_gib: float | None = None  # held by every other process on that GPU
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
    # What the supervisor adds to this server's `tokenspeed serve` (fields the profile left unset, and
    # their flags); empty when the profile sets them all, on the CPU, or when the plan does not fit.
    planned_fields: dict[str, Any] = field(default_factory=dict)
    planned_flags: list[str] = field(default_factory=list)
    fits: bool = True
    reason: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FleetPlan:
    fleet: str
    probe: Probe
    servers: list[ServerPlan]
    running: bool = False  # the fleet's own servers hold memory: planned as their restart would see it

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.servers)

    @property
    def reason(self) -> str | None:
        bad = [f"{s.name}: {s.reason}" for s in self.servers if not s.fits]
        return "; ".join(bad) or None

    @property
    def verdict(self) -> str:
        if self.running:
            return "fits as running" if self.fits else f"running; a restart now would not fit: {self.reason}"
        return "would fit now" if self.fits else f"REFUSED: {self.reason}"

    def server(self, name: str) -> ServerPlan | None:
        return next((s for s in self.servers if s.name == name), None)

    def to_dict(self) -> dict:
        return {
            "fleet": self.fleet,
            "fits": self.fits,
            "running": self.running,
            "verdict": self.verdict,
            "reason": self.reason,
            "servers": [asdict(s) for s in self.servers],
        }


def planned_fields(given: set[str], plan: dict) -> dict[str, Any]:
    """The planned values the profile did not set itself (`given`: its [server] keys), as ServerArgs
    fields for the server's command line."""
    fields: dict[str, Any] = {}
    if not {"gpu_memory_utilization", "max_total_tokens"} & given:
        fields["gpu_memory_utilization"] = plan["gpu_memory_utilization"]
    sizes = plan["cudagraph_capture_sizes"]
    if sizes and not {"max_cudagraph_capture_size", "cudagraph_capture_sizes"} & given:
        fields["max_cudagraph_capture_size"] = plan["max_cudagraph_capture_size"]
        fields["cudagraph_capture_sizes"] = list(sizes)
    return fields


def _applied(given: set[str], plan: dict) -> dict[str, Any]:
    from tokenspeed.config.cli import to_argv

    fields = planned_fields(given, plan)
    return {"planned_fields": fields, "planned_flags": to_argv(fields)}


def plan_server(
    name: str,
    gpus: list[int],
    args: Any,
    shape: ModelShape | None,
    ckpt_bytes: int | None,
    probe: Probe,
    own_mib: dict[int, float] | None = None,
    given: set[str] = frozenset(),
) -> ServerPlan:
    max_num_seqs = args.max_num_seqs
    if args.device == "cpu":
        return ServerPlan(
            name, "cpu", [], max_num_seqs=max_num_seqs, notes=["CPU: no GPU memory plan, no CUDA graphs"]
        )
    readings = probe.by_index()
    if probe.kind != "nvidia" or not readings:
        reason = (
            f'no NVIDIA GPU on {probe.hostname} ({probe.note or "none found"}); set [server] device = "cpu"'
        )
        return ServerPlan(name, args.device, gpus, fits=False, reason=reason)
    missing = [g for g in gpus if g not in readings]
    if missing:
        reason = f"GPU(s) {missing} not found: {probe.hostname} has GPUs {sorted(readings)}"
        return ServerPlan(name, args.device, gpus, fits=False, reason=reason)
    own_mib = own_mib or {}
    # The fullest GPU decides: every rank gets the pool size of the smallest (ranks agree on the minimum).
    fullest = min((readings[g] for g in gpus), key=lambda r: r.free_mib + own_mib.get(r.index, 0.0))
    total_mib = min(readings[g].total_mib for g in gpus)
    own = own_mib.get(fullest.index, 0.0)
    free_mib = fullest.free_mib + own
    util = float(args.gpu_memory_utilization)
    mapping = args.mapping
    attention = args.attention_backend or "triton"  # the default on CUDA (layers/attention/backend.py)
    sizes = mm.graph_capture_sizes(
        args.enforce_eager,
        attention,
        args.cudagraph_capture_sizes,
        args.max_cudagraph_capture_size,
        max_num_seqs,
    )
    notes = []
    others = max(fullest.total_mib - fullest.free_mib - own, 0.0)
    if others > 1024:
        notes.append(
            f"GPU {fullest.index}: {others / 1024:.1f} GiB held by other processes, not available for KV"
        )
    if own > 0:
        notes.append(
            f"GPU {fullest.index}: {own / 1024:.1f} GiB held by this fleet's servers, counted as free"
        )
    base = dict(
        name=name,
        device=args.device,
        gpus=gpus,
        gpu_name=fullest.name,
        total_gib=total_mib / 1024,
        free_gib=free_mib / 1024,
        own_gib=own / 1024,
        others_gib=others / 1024,
        gpu_memory_utilization=util,
        utilization_default=util if args.gpu_memory_utilization_defaulted else None,
        max_num_seqs=max_num_seqs,
        max_cudagraph_capture_size=max(sizes) if sizes else None,
        cudagraph_capture_sizes=sizes or [],
    )
    if shape is None:
        notes.append("model config.json not found locally: weights and KV not sized")
        return ServerPlan(**base, **_applied(given, base), notes=notes)
    dtype_bytes = mm.compute_dtype_bytes(args.dtype, shape.config_dtype, "cuda")
    max_len = min(int(args.max_model_len or shape.max_position), shape.max_position)
    weights = shape.weights_bytes_per_gpu(
        dtype_bytes,
        mapping.attn.tp_size,
        _sharded_over(mapping, "dense_tp"),
        _sharded_over(mapping, "moe_tp"),
        _sharded_over(mapping, "moe_ep"),
        int(args.ep_num_redundant_experts or 0),
        ckpt_bytes,
        layer_bytes=1 if shape.fp8_checkpoint or args.quantization == "fp8" else None,
    ) + mm.rotary_table_bytes(max_len, shape.head_dim)
    block = int(args.block_size)
    table = mm.request_table_bytes(max_num_seqs, max_len, block)
    held = mm.held_back_bytes(sizes, attention, shape.hidden, shape.intermediate, shape.vocab, dtype_bytes)
    heads = mm.kv_heads_per_rank(shape.kv_heads, mapping.attn.tp_size)
    kv_bytes = mm.kv_dtype_bytes(args.kv_cache_dtype, dtype_bytes)
    per_token = mm.kv_bytes_per_token(shape.num_layers, heads, shape.head_dim, kv_bytes)
    memory = mm.plan_gpu_memory(
        int(total_mib * MIB), int(free_mib * MIB), util, weights, table, held, per_token, block
    )
    kv_tokens = memory.kv_tokens
    if args.max_total_tokens is not None:
        kv_tokens = args.max_total_tokens // block * block
        notes.append(f"max_total_tokens {args.max_total_tokens} set: the KV pool is not sized from memory")
    # Each attention-DP rank has its own KV cache and serves its own sequences.
    dp = mapping.attn.dp_size
    if dp > 1:
        notes.append(f"KV tokens are per attention-DP rank; {dp} ranks serve sequences side by side")
    plan = dict(
        base,
        weights_gib=weights / GIB,
        reserve_gib=memory.reserve / GIB,
        kv_gib=max(kv_tokens * per_token, 0) / GIB,
        kv_bytes_per_token=per_token,
        kv_tokens=kv_tokens,
        max_model_len=max_len,
        concurrent_seqs=(kv_tokens // max_len) * dp if max_len else None,
        notes=notes,
    )
    if kv_tokens <= 0:
        reason = (
            f"weights {weights / GIB:.1f} GiB + reserve {memory.reserve / GIB:.1f} GiB per GPU exceed the "
            f"{(free_mib - total_mib * (1 - util)) / 1024:.1f} GiB left of {free_mib / 1024:.1f} GiB free "
            f"(gpu_memory_utilization {util:.2f} keeps {total_mib * (1 - util) / 1024:.1f} GiB away); "
            "use more GPUs (tp) or a smaller model"
        )
        return ServerPlan(**plan, fits=False, reason=reason)
    if kv_tokens < max_len:
        reason = (
            f"the KV cache holds {kv_tokens} tokens, less than one sequence of max_model_len {max_len}; "
            "lower max_model_len or use more GPUs"
        )
        return ServerPlan(**plan, fits=False, reason=reason)
    return ServerPlan(**plan, **_applied(given, plan))


def _sharded_over(mapping: Any, kind: str) -> int:
    """How many ranks a dense or MoE part of rank 0 really splits over (never across attention DP)."""
    single = {"moe_tp": mapping.moe_tp_size == 1, "moe_ep": mapping.moe_ep_size == 1}
    if single.get(kind, False):  # a size-1 MoE axis is this rank's alone, whatever the layout
        return 1
    return len(mapping.effective_group(kind, 0))


def plan_fleet(
    resolved,
    probe: Probe,
    config: dict | None = None,
    own_mib: dict[int, float] | None = None,
    running: bool = False,
) -> FleetPlan:
    """Plan every server of a resolved profile against `probe` (readings of each node, assumed alike);
    `own_mib` is what the fleet's own servers hold on each GPU (counted as free) when it is `running`."""
    args0 = resolved.server_args[0]
    models: dict[str, tuple] = {}  # a fleet of server groups may run several models
    servers = []
    # The [server] keys each server's profile sets (its group's included), which the plan leaves alone.
    given_keys = resolved.given_keys or (frozenset(resolved.profile.server),) * len(resolved.servers)
    for spec, args, given in zip(resolved.servers, resolved.server_args, given_keys, strict=True):
        if args.model not in models:
            found = config if config is not None and args.model == args0.model else find_config(args.model)
            models[args.model] = (model_shape(found), checkpoint_bytes(args.model)) if found else (None, None)
        shape, ckpt = models[args.model]
        servers.append(plan_server(spec.name, list(spec.gpus), args, shape, ckpt, probe, own_mib, set(given)))
    return FleetPlan(resolved.profile.fleet.name, probe, servers, running=running or bool(own_mib))


def platform_facts(probe: Probe):
    """What the seed's defaults depend on, as the probe saw it (None without NVIDIA GPUs)."""
    from tokenspeed.config.resolve import PlatformFacts

    if probe.kind != "nvidia" or not probe.gpus:
        return None
    cc = probe.gpus[0].compute_capability
    return PlatformFacts(
        "nvidia", bool(cc and tuple(cc) >= (9, 0)), min(g.total_mib for g in probe.gpus) / 1024
    )


def resolved_for(resolved, probe: Probe):
    """The profile resolved again for the probed GPUs: the seed's defaults depend on GPU memory."""
    from console.profile.fleet import resolve_profile

    facts = platform_facts(probe)
    return resolved if facts is None else resolve_profile(resolved.profile, facts)


def plan_with_platform(resolved, probe: Probe, config: dict | None = None) -> FleetPlan:
    """Re-resolve the profile for the probed GPUs, then plan it against them."""
    return plan_fleet(resolved_for(resolved, probe), probe, config)


def plan_here(
    resolved, probe: Probe | None = None, config: dict | None = None, own: FleetProcesses | None = None
) -> FleetPlan:
    """The plan on this machine: its GPUs now (or a recorded `probe`), with the memory of this fleet's own
    running servers (`own`, else the ones its state directory records) counted as free."""
    from console.gpu_owners import attribute, own_mib_by_gpu, recorded_fleet
    from console.supervisor.paths import default_state_dir

    probe = probe or probe_gpus()
    if own is None:
        own = recorded_fleet(default_state_dir(resolved.profile.fleet.name))
    own_mib = own_mib_by_gpu(attribute(probe, own)) if own is not None else None
    return plan_fleet(resolved_for(resolved, probe), probe, config, own_mib=own_mib, running=own is not None)


def check_fits(resolved, probe: Probe | None = None, own: FleetProcesses | None = None) -> str | None:
    """None when the fleet fits this machine's GPUs; otherwise why not (nothing should start). `own`:
    the fleet's servers already running, whose memory counts as free."""
    plan = plan_here(resolved, probe, own=own)
    return None if plan.fits else plan.reason


def format_plan(plan: FleetPlan) -> str:
    probe = plan.probe
    lines = [
        f"fleet {plan.fleet} on {probe.hostname} ({probe.kind}, {len(probe.gpus)} GPU(s)): {plan.verdict}"
    ]
    for s in plan.servers:
        lines.append(f"  {s.name}: device {s.device}" + (f", GPUs {s.gpus} ({s.gpu_name})" if s.gpus else ""))
        if s.total_gib is not None:
            default = "default" if s.utilization_default is not None else "from the profile"
            lines.append(
                f"    memory      {s.total_gib:.1f} GiB total, {s.free_gib:.1f} GiB free, "
                f"gpu_memory_utilization {s.gpu_memory_utilization:.2f} ({default})"
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
        if s.planned_flags:
            flags = s.planned_flags
            shown = " ".join(flags[:5]) + (" ..." if len(flags) > 5 else "")
            lines.append(f"    command     + {shown}")
        for note in s.notes:
            lines.append(f"    note        {note}")
        lines.append("    fits" if s.fits else f"    REFUSED     {s.reason}")
    return "\n".join(lines)
