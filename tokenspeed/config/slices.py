"""Typed slices of a resolved ``ServerArgs``: what one component reads, built once, frozen.

A component takes its slice instead of the whole ``ServerArgs``, so its inputs are named in one place and
every value is the resolved one (no component re-applies a default of its own). ``SchedulerConfig``
(scheduler/scheduler.py), ``ModelConfig``, ``Mapping``, ``ServerEndpoints`` and ``RequestLogger`` are the
slices that live beside their component; the ones here are shared by the rank's engine, its model runner
and the HTTP layer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from tokenspeed.runtime.speculative.config import tokens_per_verify

if TYPE_CHECKING:
    # only named in annotations: resolution builds an ExpertPlan while it runs (config.resolve)
    from tokenspeed.config.server_args import ServerArgs

# Why the expert-distribution recorder counts on every step, whatever a user's recording session does.
KEPT_BY_EPLB = "--enable-eplb needs the expert load"
KEPT_BY_METRICS = "--enable-expert-distribution-metrics exports the expert load"


def same_named(cls: type, args: ServerArgs, **derived: Any) -> dict[str, Any]:
    """The keyword arguments of slice `cls`: `derived` for the fields it names, and each other field's
    value from the ServerArgs field of the same name (an AttributeError names a field that has none)."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if f.name not in derived} | derived


@dataclass(frozen=True)
class RunnerConfig:
    """The engine core and model runner of one rank."""

    device: str  # "cuda" or "cpu"
    base_gpu_id: int
    load_format: str
    seed: int
    block_size: int
    attention_backend: str | None  # None: chosen from the device and dtype when the runner starts
    sampling_backend: str
    moe_backend: str
    enable_nan_detection: bool
    triton_attention_reduce_in_fp32: bool
    enable_prefix_caching: bool
    max_num_seqs: int
    stream_interval: int
    disable_overlap_schedule: bool
    # KV pool sizing inputs (execution/kv_sizing.py)
    max_total_tokens: int | None
    cpu_kv_cache_memory_gb: float
    gpu_memory_utilization: float
    # KV cache storage: "auto" (the model's dtype) or "fp8_e4m3", and a file of FP8 KV scales
    kv_cache_dtype: str = "auto"
    quantization_param_path: str | None = None
    # KV layers beside the model's that share its pages (an EAGLE3 draft's one layer), sized into the pool
    draft_kv_layers: int = 0
    # tokens a speculative verify forward computes per request (1: no speculation); sizes verify graphs
    spec_tokens_per_req: int = 1
    # bf16/fp16 linears at decode batches of 1-4 rows: auto | triton | torch (layers/dense_gemv.py)
    dense_gemv_backend: str = "auto"

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> RunnerConfig:
        # every field ServerArgs holds under the same name, as resolved; only these are derived
        return cls(
            **same_named(
                cls,
                args,
                stream_interval=max(1, args.stream_interval),
                disable_overlap_schedule=bool(args.disable_overlap_schedule),
                draft_kv_layers=1 if args.speculative_algorithm == "EAGLE3" else 0,
                spec_tokens_per_req=tokens_per_verify(args),
            )
        )


@dataclass(frozen=True)
class GraphConfig:
    """Decode CUDA graphs: whether they are captured, at which batch sizes, how they are replayed."""

    enforce_eager: bool = False
    capture_sizes: tuple[int, ...] | None = None  # explicit sizes; None derives them from max_capture_size
    max_capture_size: int | None = None
    pad: bool = True  # replay a batch in the next larger graph, padded
    enable_gc: bool = False  # collect garbage between captures (slower start, less host memory)

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> GraphConfig:
        sizes = args.cudagraph_capture_sizes
        return cls(
            # --device cpu, a prefill-only server and expert parallelism were folded into enforce_eager
            # when the arguments were resolved
            enforce_eager=args.enforce_eager,
            capture_sizes=None if sizes is None else tuple(sizes),
            max_capture_size=args.max_cudagraph_capture_size,
            pad=not args.disable_cuda_graph_padding,
            enable_gc=args.enable_cudagraph_gc,
        )


@dataclass(frozen=True)
class ExpertPlan:
    """How MoE experts are placed, dispatched, recorded and rebalanced on this server."""

    # what shapes the model (tensor_parallel.apply_parallelism)
    init_expert_location: str = "trivial"
    num_redundant_experts: int = 0
    dispatch_algorithm: str = "static"
    eplb_algorithm: str = "auto"
    all2all_backend: str = "none"
    # what runs beside it
    ep_size: int = 1
    recorder_mode: str | None = None
    recorder_buffer_size: int | None = None
    enable_metrics: bool = False
    enable_eplb: bool = False
    rebalance_num_iterations: int = 1000

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> ExpertPlan:
        return cls(
            init_expert_location=args.init_expert_location or "trivial",
            num_redundant_experts=int(args.ep_num_redundant_experts or 0),
            dispatch_algorithm=args.ep_dispatch_algorithm or "static",
            eplb_algorithm=args.eplb_algorithm or "auto",
            all2all_backend=args.all2all_backend or "none",
            ep_size=args.mapping.moe_ep_size,
            recorder_mode=args.expert_distribution_recorder_mode,
            recorder_buffer_size=args.expert_distribution_recorder_buffer_size,
            enable_metrics=args.enable_expert_distribution_metrics,
            enable_eplb=args.enable_eplb,
            rebalance_num_iterations=int(args.eplb_rebalance_num_iterations or 1000),
        )

    @property
    def wants_recorder(self) -> bool:
        return bool(self.recorder_mode) or self.enable_metrics

    @property
    def moves_experts(self) -> bool:
        """Whether experts are placed, recorded or rebalanced beyond the plain single-rank model."""
        return self.ep_size > 1 or self.num_redundant_experts > 0 or self.wants_recorder or self.enable_eplb

    @property
    def kept_by(self) -> str | None:
        """The reason the recorder counts with or without a user's recording session, or None."""
        if self.enable_eplb:
            return KEPT_BY_EPLB
        if self.enable_metrics:
            return KEPT_BY_METRICS
        return None
