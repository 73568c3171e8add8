"""Validation of ``ServerArgs``: input checks before resolution, consistency checks after it.

Every error is a ``ValueError`` that names the flag and what would fix it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tokenspeed.config.flags import CHOICES_CHECKED_ELSEWHERE, FIELD_CHOICES
from tokenspeed.config.server_fields import ServerFields

_JSON_OBJECT_FIELDS = (
    "hf_overrides",
    "kv_events_config",
    "preferred_sampling_params",
    "kvstore_storage_backend_extra_config",
)
# Fields that must be >= 1 when set.
_POSITIVE_FIELDS = (
    "max_num_seqs",
    "max_total_tokens",
    "max_prefill_tokens",
    "block_size",
    "stream_interval",
    "world_size",
    "attn_tp_size",
    "dense_tp_size",
    "moe_tp_size",
    "data_parallel_size",
    "nprocs_per_node",
    "nnodes",
    "gpu_id_step",
    "max_model_len",
    "weight_loader_prefetch_num_threads",
    "max_request_bytes",
    "max_sequences_per_request",
    "max_queued_requests",
    "max_queued_tokens",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_inputs(args: ServerFields) -> None:
    """Reject values no rule could make sense of, before anything is derived from them."""
    if not args.model:
        raise ValueError("a model is required: `tokenspeed serve MODEL` or --model MODEL")
    for name, allowed in FIELD_CHOICES.items():
        if name in CHOICES_CHECKED_ELSEWHERE:
            continue
        value = vars(args)[name]
        values = value if isinstance(value, list) else [value]
        for item in values:
            if item is not None and item not in allowed:
                raise ValueError(
                    f"{_flag(name)} {item!r} is not supported; choose one of {', '.join(map(str, allowed))}"
                )
    for name in _POSITIVE_FIELDS:
        value = vars(args)[name]
        if value is not None and value < 1:
            raise ValueError(f"{_flag(name)} must be >= 1, got {value}")
    if args.ep_size is not None and args.ep_size < 1:
        raise ValueError(f"--ep-size must be >= 1, got {args.ep_size}")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(
            f"--gpu-memory-utilization is a fraction in (0, 1], got {args.gpu_memory_utilization}"
        )
    if args.chunked_prefill_size is not None and (
        args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1
    ):
        raise ValueError(
            f"--chunked-prefill-size must be a positive token count or -1 (off), got {args.chunked_prefill_size}"
        )
    if not args.cpu_kv_cache_memory_gb > 0:
        raise ValueError(f"--cpu-kv-cache-memory-gb must be > 0, got {args.cpu_kv_cache_memory_gb}")
    if args.base_gpu_id < 0:
        raise ValueError(f"--base-gpu-id must be >= 0, got {args.base_gpu_id}")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(
            f"--node-rank must be in 0..{args.nnodes - 1} for --nnodes {args.nnodes}, got {args.node_rank}"
        )
    if args.nnodes > 1 and args.dist_init_addr is None:
        raise ValueError(f"--nnodes {args.nnodes} needs --dist-init-addr HOST:PORT of the head node")
    if args.speculative_num_steps < 0:
        raise ValueError(f"--speculative-num-steps must be >= 0, got {args.speculative_num_steps}")
    if args.speculative_num_draft_tokens is not None and args.speculative_num_draft_tokens < 1:
        raise ValueError(
            f"--speculative-num-draft-tokens must be >= 1, got {args.speculative_num_draft_tokens}"
        )
    for name in _JSON_OBJECT_FIELDS:
        json_object_flag(name, vars(args)[name])
    _check_preferred_sampling_params(args.preferred_sampling_params)
    _check_kv_scales_file(args)


def _check_kv_scales_file(args: ServerFields) -> None:
    path = args.quantization_param_path
    if path is None:
        return
    if args.kv_cache_dtype == "auto":
        raise ValueError(
            f"--quantization-param-path {path} gives FP8 KV cache scales, which a KV cache in the model's "
            "dtype does not use; add --kv-cache-dtype fp8_e4m3 or drop --quantization-param-path"
        )
    if not os.path.isfile(path):
        raise ValueError(f"--quantization-param-path {path}: no such file (a JSON file of KV cache scales)")


def json_object_flag(name: str, value: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON object the flag of field ``name`` holds; None when unset. A dict (from a profile or a
    caller that parsed it already) is taken as it is, copied."""
    if value is None:
        return None
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{_flag(name)} must be a JSON object, got {value!r}: not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{_flag(name)} must be a JSON object ({{...}}), got {value!r}")
    return parsed


def _check_preferred_sampling_params(text: str | None) -> None:
    """Every key must be a sampling parameter with a valid value: a misspelt one would be dropped silently."""
    if text is None:
        return
    from tokenspeed.sampling_params import SamplingParams

    try:
        SamplingParams.from_dict(json.loads(text)).verify()
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"--preferred-sampling-params: {exc} (keys are /generate's sampling_params names, e.g. max_new_tokens)"
        ) from None


def _check_dp_leaders_on_head(mapping) -> None:
    # The data-parallel controller runs on the head node and reaches each group through the rank leading
    # it (attention TP/CP rank 0), at addresses on the head; a group led from another node is unreachable.
    for rank in range(mapping.world_size):
        p = mapping.placement(rank)
        if p.attn_tp_rank == 0 and p.attn_cp_rank == 0 and p.node_rank != 0:
            raise ValueError(
                f"--data-parallel-size {mapping.attn_dp_size} with --nnodes {mapping.nnodes} puts data-parallel "
                f"group {p.attn_dp_rank} on node {p.node_rank}, but every group must be led from the head node "
                "(node 0); run one server per node instead (a fleet profile with a replica per node), or "
                "spread tensor parallelism over the nodes with --data-parallel-size 1"
            )


def validate(args: ServerFields) -> None:
    """Consistency checks on resolved values, plus the expert-placement defaults that depend on them."""
    mapping = args.mapping
    if args.max_num_seqs < mapping.attn_dp_size:
        raise ValueError(
            f"--max-num-seqs {args.max_num_seqs} is below the data parallel size {mapping.attn_dp_size}; "
            "every replica needs at least one slot: raise --max-num-seqs"
        )
    if mapping.attn.has_dp and mapping.nnodes > 1:
        _check_dp_leaders_on_head(mapping)
    if mapping.attn.has_cp and args.max_num_seqs > 1:
        raise ValueError(
            f"context parallelism (ENABLE_CP=1, size {mapping.attn_cp_size}) serves one sequence at a time: "
            f"set --max-num-seqs 1 (got {args.max_num_seqs})"
        )
    if mapping.attn.has_dp and args.chunked_prefill_size > args.max_prefill_tokens:
        raise ValueError(
            f"with data parallelism --chunked-prefill-size ({args.chunked_prefill_size}) must not exceed "
            f"--max-prefill-tokens ({args.max_prefill_tokens}); lower the first or raise the second"
        )
    if args.deepseek_v4_prefill_chunk_size <= 0:
        raise ValueError(
            f"--deepseek-v4-prefill-chunk-size must be positive, got {args.deepseek_v4_prefill_chunk_size}"
        )


def server_environment(args: ServerFields) -> dict[str, str]:
    """Environment variables the server's processes need for ``args``.

    Kept out of resolution so building a ``ServerArgs`` (for ``--print-config``, a profile check or a
    test) never changes the calling process. ``apply`` semantics: the PDL ones are defaults (an
    explicit environment wins), the Mamba dtype is always set.
    """
    env = {"TOKENSPEED_MAMBA_SSM_DTYPE": args.mamba_ssm_dtype}
    if not args.disable_pdl and args.device != "cpu":
        env.update(TORCHINDUCTOR_ENABLE_PDL="1", TRTLLM_ENABLE_PDL="1", TLLM_LOG_LEVEL="INFO")
    return env
