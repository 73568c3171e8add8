"""Resolution rules of ``ServerArgs``: derived defaults, then validation.

Every rule takes the platform facts as an argument, so the whole resolution runs (and is tested)
without a GPU. Rules only fill values that are unset, so resolving a resolved ``ServerArgs`` again
changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from typing import Any

from tokenspeed.config.flags import CPU_ATTENTION_BACKENDS, CPU_SAMPLING_BACKENDS, FIELD_CHOICES
from tokenspeed.config.server_fields import ServerFields
from tokenspeed.config.validate import check_inputs, validate
from tokenspeed.platform import KindChecks, PlatformKind, current_platform
from tokenspeed.runtime.distributed.mapping import Mapping

logger = logging.getLogger(__name__)

# GPU memory (MiB) below which CUDA graphs are kept small: graph memory matters more than the
# few percent of speed larger graphs give on such cards.
SMALL_GPU_MIB = 25_000
SPECULATIVE_CONFIG_KEYS = ("method", "model", "num_speculative_tokens")


@dataclasses.dataclass(frozen=True)
class PlatformFacts(KindChecks):
    """What resolution needs to know about the machine."""

    kind: PlatformKind
    is_hopper_or_newer: bool = False
    gpu_memory_gb: float | None = None


def platform_facts(args: ServerFields, platform: Any = None) -> PlatformFacts:
    """Facts from ``platform`` (any object with ``kind``, ``is_hopper_or_newer``, ``gpu_memory_capacity_gb()``).

    With ``--device cpu`` the GPU is never probed. Otherwise ``platform=None`` asks
    ``tokenspeed.platform.current_platform()``.
    """
    if args.device == "cpu":
        return PlatformFacts(kind="cpu")
    if platform is None:
        platform = current_platform()
    if isinstance(platform, PlatformFacts):
        return platform
    kind = platform.kind
    memory = platform.gpu_memory_capacity_gb() if kind in ("nvidia", "amd") else None
    return PlatformFacts(
        kind=kind,
        is_hopper_or_newer=bool(getattr(platform, "is_hopper_or_newer", False)),
        gpu_memory_gb=memory,
    )


def resolve_server_args(args: ServerFields, platform: Any = None) -> PlatformFacts:
    """Fill what ``args`` leaves unset and validate it; returns the platform facts it was resolved against."""
    check_inputs(args)
    facts = platform_facts(args, platform)
    resolve_basic_defaults(args)
    resolve_parallelism(args)
    resolve_memory_and_scheduling(args, facts)
    resolve_kernel_backends(args, facts)
    resolve_cache(args)
    resolve_speculative_decoding(args)
    resolve_communication(args, facts)
    resolve_disaggregation(args)
    resolve_experts(args)
    validate(args)
    return facts


def maybe_model_redirect(model: str) -> str:
    """Map a model name to a local path through ``TOKENSPEED_MODEL_REDIRECT_PATH`` (lines ``name<TAB>path``)."""
    table = os.environ.get("TOKENSPEED_MODEL_REDIRECT_PATH")
    if not table or not os.path.isfile(table):
        return model
    with open(table, encoding="utf-8") as f:
        for line in f:
            name, sep, target = line.rstrip("\n").partition("\t")
            if sep and name.strip() == model:
                return target.strip()
    return model


def resolve_basic_defaults(args: ServerFields) -> None:
    args.model = maybe_model_redirect(args.model)
    if args.kv_cache_dtype == "fp8":
        args.kv_cache_dtype = "fp8_e4m3"
    resolve_config_aliases(args)
    if args.tokenizer is None:
        args.tokenizer = args.model
    if args.served_model_name is None:
        args.served_model_name = args.model
    if args.seed is None:
        args.seed = random.randint(0, 1 << 30)
    # Prometheus unless told otherwise, each reporter once: the same from a command line or a dict.
    args.metrics_reporters = list(dict.fromkeys(args.metrics_reporters or ["prometheus"]))


def resolve_config_aliases(args: ServerFields) -> None:
    """Fold ``--attention-config.*`` and ``--speculative-config`` into the fields they stand for."""
    if args.use_trtllm_ragged_deepseek_prefill is not None:
        args.mla_disable_ragged = not args.use_trtllm_ragged_deepseek_prefill
    if args.speculative_config is None:
        return
    try:
        config = json.loads(args.speculative_config)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config is not valid JSON ({exc}); pass a JSON object") from exc
    if not isinstance(config, dict):
        raise ValueError('--speculative-config must be a JSON object, e.g. {"method": "eagle3"}')
    unknown = sorted(set(config) - set(SPECULATIVE_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"--speculative-config has unsupported keys {unknown}; supported: {', '.join(SPECULATIVE_CONFIG_KEYS)}"
        )
    if config.get("method") is not None and args.speculative_algorithm is None:
        args.speculative_algorithm = str(config["method"]).upper()
        if args.speculative_algorithm not in FIELD_CHOICES["speculative_algorithm"]:
            raise ValueError(
                f"--speculative-config method {config['method']!r} is not supported; use one of "
                f"{', '.join(m.lower() for m in FIELD_CHOICES['speculative_algorithm'])}"
            )
    if config.get("model") is not None and args.speculative_draft_model_path is None:
        args.speculative_draft_model_path = str(config["model"])
    tokens = config.get("num_speculative_tokens")
    if tokens is None:
        return
    try:
        tokens = int(tokens)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"--speculative-config num_speculative_tokens must be an integer, got {tokens!r}"
        ) from exc
    if tokens < 1:
        raise ValueError(f"--speculative-config num_speculative_tokens must be >= 1, got {tokens}")
    if args.speculative_algorithm == "DFLASH":
        # DFLASH drafts a block in one pass: its draft-token count includes the verified token.
        if args.speculative_num_draft_tokens is None:
            args.speculative_num_draft_tokens = tokens
        args.speculative_num_steps = max(tokens - 1, 0)
    else:
        args.speculative_num_steps = tokens
        if args.speculative_num_draft_tokens is None:
            args.speculative_num_draft_tokens = args.speculative_num_steps + 1


def resolve_parallelism(args: ServerFields) -> None:
    # ENABLE_CP is read here, per call, so a launcher can set it for one server without re-importing.
    args.mapping = Mapping.from_server_args(args)
    if args.enable_expert_parallel and args.ep_size in (None, 1):
        logger.info("--enable-expert-parallel: ep_size set to the world size %s", args.mapping.world_size)
    args.ep_size = args.mapping.moe_ep_size
    if args.mapping.moe.has_tp and args.mapping.moe.has_ep:
        raise ValueError(
            f"MoE layers use TP or EP, not both: moe_tp_size={args.mapping.moe_tp_size} and "
            f"ep_size={args.mapping.moe_ep_size}; set --moe-tp-size 1 to use --ep-size (or --ep-size 1)"
        )
    logger.debug("Parallelism:\n%s", args.mapping.table())


def default_gpu_memory_utilization(world_size: int) -> float:
    """Larger deployments leave more headroom for communication buffers and graphs."""
    if world_size >= 16:
        return 0.79
    if world_size >= 8:
        return 0.81
    if world_size >= 4:
        return 0.95
    if world_size >= 2:
        return 0.87
    return 0.88


def resolve_memory_and_scheduling(args: ServerFields, facts: PlatformFacts) -> None:
    world_size = args.mapping.world_size
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = default_gpu_memory_utilization(world_size)
        args._gpu_memory_utilization_defaulted = True
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = 8192
    if args.max_cudagraph_capture_size is None:
        small_gpu = facts.gpu_memory_gb is not None and facts.gpu_memory_gb * 1024 < SMALL_GPU_MIB
        if small_gpu:
            # TP1/TP2 on small cards lose almost nothing with tiny graphs; TP4+ still need them.
            args.max_cudagraph_capture_size = 8 if world_size < 4 else 80
        elif args.speculative_algorithm is not None:
            # As the seed does: a verify forward computes each request's token and its drafts, and the
            # draft model holds memory beside the target's, so the largest graph and the batch are halved.
            args.max_cudagraph_capture_size = 80
        else:
            args.max_cudagraph_capture_size = 160
    if args.max_num_seqs is None:
        if args.mapping.attn.has_cp:
            args.max_num_seqs = 1  # context parallelism splits one sequence over ranks: one at a time
        else:
            args.max_num_seqs = 80 if args.speculative_algorithm is not None else 160


def resolve_kernel_backends(args: ServerFields, facts: PlatformFacts) -> None:
    # The GPU attention default is left to the attention initializer, which knows the model.
    if args.device == "cpu":
        resolve_cpu_defaults(args)
    if args.disable_overlap_schedule is None:
        args.disable_overlap_schedule = args.device == "cpu"
    if args.sampling_backend is None:
        # Greedy ignores temperature/top-p/top-k, so it is only the default where nothing else runs.
        if facts.is_nvidia:
            args.sampling_backend = "flashinfer"
        elif facts.kind == "cpu" and args.device == "cpu":
            args.sampling_backend = "torch"
        else:
            args.sampling_backend = "greedy"


def resolve_cpu_defaults(args: ServerFields) -> None:
    """``--device cpu``: torch kernels and no CUDA graphs."""
    if args.attention_backend is None:
        args.attention_backend = "torch"
    if args.attention_backend not in CPU_ATTENTION_BACKENDS:
        raise ValueError(
            f"--attention-backend {args.attention_backend} needs a GPU; with --device cpu use "
            f"{' or '.join(CPU_ATTENTION_BACKENDS)} (or leave it unset)"
        )
    if args.sampling_backend is not None and args.sampling_backend not in CPU_SAMPLING_BACKENDS:
        raise ValueError(
            f"--sampling-backend {args.sampling_backend} needs a GPU; with --device cpu use "
            f"{' or '.join(CPU_SAMPLING_BACKENDS)} (or leave it unset)"
        )
    args.enforce_eager = True
    args.disable_prefill_graph = True


def resolve_cache(args: ServerFields) -> None:
    if args.disaggregation_mode in ("decode", "encode"):
        args.enable_kvstore = False
        logger.info("%s server: KVStore off", args.disaggregation_mode)
    elif args.device == "cpu":
        # The KV pool already lives in host memory; a host tier behind it would only copy it.
        args.enable_kvstore = False
    # The seed turns the KVStore on by default on a GPU; it is not built here (config.support), so it stays
    # off unless a profile asks for it, which the support check then refuses.
    if args.kvstore_storage_backend == "mooncake":
        if args.kvstore_mem_layout == "layer_first":
            args.kvstore_mem_layout = "page_first"
            logger.warning(
                "Mooncake storage needs a page-based layout; --kvstore-mem-layout set to page_first"
            )
        if args.kvstore_io_backend == "direct":
            args.kvstore_io_backend = "kernel"
            logger.warning(
                "Mooncake's page_first layout needs the kernel io backend; --kvstore-io-backend kernel"
            )
    if args.enable_kvstore and not args.enable_prefix_caching:
        raise ValueError(
            "the KVStore tier keeps prefix-cache pages, so it cannot run with prefix caching off: "
            "drop enable_kvstore (or --no-enable-prefix-caching)"
        )


def resolve_speculative_decoding(args: ServerFields) -> None:
    if args.speculative_algorithm is not None and args.drafter_attention_backend is None:
        args.drafter_attention_backend = args.attention_backend
    if args.speculative_algorithm == "MTP" and args.speculative_draft_model_path is None:
        # MTP heads ship inside the base checkpoint.
        args.draft_model_path_use_base = True
    if args.draft_model_path_use_base:
        args.speculative_draft_model_path = args.model
    if args.speculative_draft_model_path == args.model:
        args.draft_model_path_use_base = True
    if args.speculative_draft_model_quantization == "unquant":
        args.speculative_draft_model_quantization = None
    if args.speculative_algorithm == "DFLASH":
        if args.speculative_num_draft_tokens is None:
            raise ValueError(
                "--speculative-algorithm DFLASH needs a block size: pass --speculative-num-draft-tokens N or "
                '--speculative-config \'{"method": "dflash", "num_speculative_tokens": N}\''
            )
        expected = max(int(args.speculative_num_draft_tokens) - 1, 0)
        default_steps = _field_default(args, "speculative_num_steps")
        if args.speculative_num_steps == default_steps:
            args.speculative_num_steps = expected
        elif args.speculative_num_steps != expected:
            raise ValueError(
                "DFLASH requires --speculative-num-steps = --speculative-num-draft-tokens - 1; got "
                f"speculative_num_steps={args.speculative_num_steps} and "
                f"speculative_num_draft_tokens={args.speculative_num_draft_tokens}: drop "
                f"--speculative-num-steps or set it to {expected}"
            )
    elif args.speculative_algorithm is not None and args.speculative_num_draft_tokens is None:
        # Chain drafting verifies every drafted token plus the one the target model adds.
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    elif args.speculative_algorithm == "EAGLE3":
        _resolve_chain_steps(args)
    if args.speculative_algorithm == "NGRAM":
        _check_ngram_windows(args)
    if isinstance(args.eagle3_layers_to_capture, str):
        try:
            args.eagle3_layers_to_capture = [int(x) for x in args.eagle3_layers_to_capture.split(",")]
        except ValueError as exc:
            raise ValueError(
                f"--eagle3-layers-to-capture must be comma-separated layer indices (e.g. 2,16,29), got "
                f"{args.eagle3_layers_to_capture!r}"
            ) from exc
    if args.speculative_algorithm is not None and args.speculative_eagle_topk != 1:
        raise ValueError(
            f"--speculative-eagle-topk {args.speculative_eagle_topk}: tree drafting (topk > 1) is not "
            "supported; only chain drafting runs end to end, so use --speculative-eagle-topk 1"
        )
    if args.speculative_algorithm == "EAGLE3" and args.speculative_draft_model_path is None:
        raise ValueError(
            "--speculative-algorithm EAGLE3 needs its draft model: pass --speculative-draft-model-path DIR "
            "(an EAGLE3 draft in the Hugging Face layout)"
        )


def _resolve_chain_steps(args: ServerFields) -> None:
    """Chain drafting runs one draft step per drafted token: steps = draft tokens - 1."""
    expected = args.speculative_num_draft_tokens - 1
    if args.speculative_num_steps == expected:
        return
    if args.speculative_num_steps == _field_default(args, "speculative_num_steps"):
        args.speculative_num_steps = expected
        return
    raise ValueError(
        "chain drafting (--speculative-eagle-topk 1) verifies the drafted tokens plus one, so "
        "--speculative-num-draft-tokens must be --speculative-num-steps + 1; got "
        f"speculative_num_steps={args.speculative_num_steps} and "
        f"speculative_num_draft_tokens={args.speculative_num_draft_tokens}: pass only one of them"
    )


def _check_ngram_windows(args: ServerFields) -> None:
    lo, hi = args.speculative_ngram_min_match_window_size, args.speculative_ngram_max_match_window_size
    if lo < 1 or hi < lo:
        raise ValueError(
            "NGRAM match windows must satisfy 1 <= --speculative-ngram-min-match-window-size <= "
            f"--speculative-ngram-max-match-window-size; got {lo} and {hi}"
        )


def resolve_communication(args: ServerFields, facts: PlatformFacts) -> None:
    mapping = args.mapping
    if (
        not args.enable_allreduce_fusion
        and (facts.is_hopper_or_newer or facts.is_amd)
        and mapping.nnodes == 1
        and mapping.attn.has_tp
        and not mapping.attn.has_dp
    ):
        args.enable_allreduce_fusion = True
        logger.info("allreduce fusion on (single-node TP on a supported GPU)")
    if mapping.attn.tp_size != mapping.dense.tp_size:
        # The fused kernel reduces over one group; attention and dense groups differ here.
        args.comm_fusion_max_num_tokens = -1
        args.enable_allreduce_fusion = False
        logger.info(
            "allreduce fusion off: attention TP %s differs from dense TP %s",
            mapping.attn.tp_size,
            mapping.dense.tp_size,
        )


def resolve_disaggregation(args: ServerFields) -> None:
    mode = args.disaggregation_mode
    if mode == "prefill":
        # Prefill batches vary too much in shape for CUDA graphs to pay off.
        args.enforce_eager = True
        logger.info("prefill server: CUDA graphs off")
    elif mode == "encode":
        if args.mapping.attn.has_dp:
            raise ValueError(
                "--disaggregation-mode encode runs one replica per server: drop --data-parallel-size "
                f"({args.mapping.attn_dp_size}) and start more encode servers instead"
            )
        args.enable_prefix_caching = False
    if mode == "prefill" and args.load_balance_method != "round_robin" and args.mapping.attn.has_dp:
        raise ValueError(
            f"a prefill server with data parallel size {args.mapping.attn_dp_size} needs "
            f"--load-balance-method round_robin (got {args.load_balance_method})"
        )


def resolve_experts(args: ServerFields) -> None:
    if args.enable_eplb and args.expert_distribution_recorder_mode is None:
        # Rebalancing needs load counts; the aggregate mode is the cheapest that gives them.
        args.expert_distribution_recorder_mode = "stat"
        logger.info("--enable-eplb: expert distribution recorder mode set to stat")
    if (args.enable_eplb or args.init_expert_location is not None) and args.ep_dispatch_algorithm is None:
        args.ep_dispatch_algorithm = "static"
    per_token = args.expert_distribution_recorder_mode == "per_token"
    if args.device == "cuda" and per_token and not args.enforce_eager:
        # per_token recording copies every layer's routed ids to the host inside the forward, which a CUDA
        # graph cannot capture; every other expert setup (EP, redundant experts, stat recording, EPLB)
        # runs inside the graphs (runtime/moe/distribution_recorder.py)
        args.enforce_eager = True
        logger.info(
            "--expert-distribution-recorder-mode per_token: CUDA graphs off (it copies each layer's routed "
            "expert ids to the host every step); use stat or per_pass to keep them"
        )


def _field_default(args: ServerFields, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(args) if f.name == name)
