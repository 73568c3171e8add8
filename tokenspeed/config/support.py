"""What every ``ServerArgs`` field does in this build: one entry per field, nothing left unstated.

- ``implemented``: the server reads the value and it changes what the server does; the entry names the
  test file that shows the effect. An entry may list the ``values`` this build implements (a registry's
  names); any other value of the seed's choices is refused at start-up like a refused field.
- ``refused unless default``: the part is not built; a non-default value stops ``tokenspeed serve``,
  the offline Engine and a profile check before any weight is loaded, with the reason and what to use
  instead.
- ``accepted, no effect by design``: a knob of a kernel, model family or device feature this build does
  not have, where doing nothing is the correct outcome (e.g. a tuning size of a fused kernel that is not
  used). A server given one logs a single WARNING line listing them, and ``/get_server_info`` lists them.

``config.support_check`` applies the table; ``tests/unit/test_support_table.py`` fails when a field has
no entry, so a new seed field cannot slip through unclassified.
"""

from __future__ import annotations

import dataclasses
from typing import Any

IMPLEMENTED = "implemented"
REFUSED = "refused unless default"
NO_EFFECT = "accepted, no effect by design"

# Reasons shared by several fields.
_NO_KVSTORE = "the host-memory KVStore tier is not implemented in this build"
_KVSTORE_INSTEAD = "drop the --kvstore-* flags; the device KV pool with the prefix cache is what runs"
_NO_DISAGG = "disaggregated prefill/decode serving is not implemented in this build"
_NO_MAMBA = "no linear-attention (Mamba) model is implemented, so there is no Mamba state cache to size"
_NO_DEEPSEEK = "DeepSeek MLA / sparse-attention models and their kernels are not in this build"
_NO_PREFILL_GRAPH = "prefill always runs eagerly; only decode steps are captured in CUDA graphs"
_NO_FUSED_COMM = "collectives are plain NCCL/gloo calls; the fused and symmetric-memory kernels are not built"
_NO_PREFETCH = "checkpoints are read once with safetensors/torch.load; there is no prefetch stage"


@dataclasses.dataclass(frozen=True)
class Support:
    status: str  # IMPLEMENTED, REFUSED or NO_EFFECT
    # IMPLEMENTED: the test file (under tests/) showing the effect; otherwise the reason.
    note: str
    instead: str = ""  # REFUSED: what to do instead
    # IMPLEMENTED with a registry behind it: the values that run; other values are refused.
    values: tuple[Any, ...] | None = None


# An implemented field whose effect no test shows yet (listed, so the gap is visible).
UNTESTED = "read by the server; no test of its effect yet"


def _impl(test: str, values: tuple[Any, ...] | None = None) -> Support:
    return Support(IMPLEMENTED, test, values=values)


def _refused(reason: str, instead: str) -> Support:
    return Support(REFUSED, reason, instead)


def _inert(reason: str) -> Support:
    return Support(NO_EFFECT, reason)


# The registries' names, spelled here so the check runs without importing torch (start-up refusals must
# come in well under two seconds); tests/unit/test_support_table.py checks they match the registries.
ATTENTION_IMPLEMENTED = (None, "torch", "triton", "flashinfer")
SAMPLING_IMPLEMENTED = (None, "greedy", "torch", "flashinfer", "flashinfer_full", "triton", "triton_full")
MOE_IMPLEMENTED = ("auto", "torch", "triton")
DENSE_GEMV_IMPLEMENTED = ("auto", "torch", "triton")
LOAD_FORMATS_IMPLEMENTED = ("auto", "safetensors", "pt", "dummy")
TOKENIZER_MODES_IMPLEMENTED = ("auto", "slow")
ALL2ALL_IMPLEMENTED = ("none",)
DISPATCH_IMPLEMENTED = (None, "static", "dynamic")
EPLB_IMPLEMENTED = ("auto", "deepseek", "deepseek_hierarchical")
GRAMMAR_IMPLEMENTED = ("none", "xgrammar", "llguidance")
# tokenspeed.runtime.entrypoints.openai.reasoning_parsers.REASONING_PARSERS
REASONING_PARSERS_IMPLEMENTED = (None, "qwen3", "deepseek-r1", "deepseek_r1")
# tokenspeed.runtime.entrypoints.openai.tool_parsers.TOOL_PARSERS
TOOL_PARSERS_IMPLEMENTED = (None, "hermes", "qwen25", "llama3_json")
# tokenspeed.runtime.speculative.config.SPECULATIVE_ALGORITHMS
SPECULATIVE_IMPLEMENTED = (None, "EAGLE3", "NGRAM")
# Seed algorithms that need layers inside the target checkpoint (config.support_check refuses them by name).
SPECULATIVE_IN_CHECKPOINT = ("MTP", "DFLASH")

SUPPORT: dict[str, Support] = {
    # Model and tokenizer
    "model": _impl("server/test_openai_api.py"),
    "tokenizer": _impl("server/test_tokenizer.py"),
    "tokenizer_mode": _impl("server/test_tokenizer.py", TOKENIZER_MODES_IMPLEMENTED),
    "skip_tokenizer_init": _impl("server/test_api_support.py"),
    "load_format": _impl("engine/test_loader.py", LOAD_FORMATS_IMPLEMENTED),
    "trust_remote_code": _impl("server/test_tokenizer.py"),
    "dtype": _impl("engine/test_loader.py"),
    # FP8 e4m3 KV pool with per-tensor K/V scales ("fp8" resolves to "fp8_e4m3")
    "kv_cache_dtype": _impl("engine/test_fp8_kv_cache.py", ("auto", "fp8", "fp8_e4m3")),
    # per_token_head (a scale per token and head, computed at write time) is not built: per-tensor scales
    "kv_cache_quant_method": _impl("engine/test_fp8_kv_cache.py", ("none",)),
    # FP8 checkpoints are detected from config.json; fp8 also quantizes an unquantized checkpoint at load.
    # mxfp4, nvfp4 and w8a8_fp8 checkpoints have no loader here.
    "quantization": _impl("engine/test_fp8_weights.py", (None, "fp8", "compressed-tensors")),
    "quantization_param_path": _impl("engine/test_fp8_kv_cache.py"),
    "max_model_len": _impl("engine/test_engine_api.py"),
    "device": _impl("server/test_serve_cli.py"),
    "served_model_name": _impl("server/test_native_api.py"),
    "revision": _impl("server/test_tokenizer.py"),
    "language_model_only": _inert("every model this build serves is text-only"),
    # HTTP server
    "host": _impl("server/test_serve_cli.py"),
    "port": _impl("server/test_serve_cli.py"),
    # Memory and scheduling
    "gpu_memory_utilization": _impl("unit/test_allocator_kv_sizing.py"),
    "max_num_seqs": _impl("unit/test_allocator_kv_sizing.py"),
    "max_total_tokens": _impl("engine/test_engine_api.py"),
    "chunked_prefill_size": _impl("engine/test_engine_correctness.py"),
    "max_prefill_tokens": _impl("engine/test_engine_correctness.py"),
    "enable_mixed_batch": _impl("engine/test_engine_correctness.py"),
    "block_size": _impl("engine/test_engine_correctness.py"),
    "cpu_kv_cache_memory_gb": _impl("unit/test_allocator_kv_sizing.py"),
    # Mamba state caches
    **dict.fromkeys(
        (
            "mamba_ssm_dtype",
            "mamba_track_interval",
            "max_mamba_cache_size",
            "mamba_full_memory_ratio",
            "enable_mamba_l2",
            "mamba_l2_host_slots",
            "mamba_l2_ratio",
            "mamba_l2_layout",
            "mamba_l2_io_backend",
            "mamba_l2_host_gb",
        ),
        _inert(_NO_MAMBA),
    ),
    # Other runtime options
    "stream_interval": _impl("server/test_lifecycle.py"),
    "stream_output": _impl("server/test_lifecycle.py"),
    "enable_inline_detokenizer": _refused(
        "detokenization always runs inline in the HTTP process", "leave enable_inline_detokenizer unset"
    ),
    "seed": _impl("engine/test_sampling.py"),
    "distributed_timeout_seconds": _impl(UNTESTED),
    "download_dir": _inert("TokenSpeed never downloads weights: the model is a local folder or a demo name"),
    "ext_yaml": _refused(
        "extensible (YAML-described) models are not implemented", "serve a Hugging Face model folder"
    ),
    "base_gpu_id": _impl("unit/test_mapping.py"),
    "gpu_id_step": _impl("unit/test_mapping.py"),
    # Logging and metrics
    "log_level": _impl(UNTESTED),
    "log_level_http": _impl(UNTESTED),
    "enable_log_requests": _impl("server/test_native_api.py"),
    "log_requests_level": _impl("server/test_native_api.py"),
    "enable_log_request_stats": _impl("server/test_native_api.py"),
    "enable_metrics": _impl("server/test_request_phase_metrics.py"),
    "decode_log_interval": _impl(UNTESTED),
    "metrics_reporters": _impl("server/test_request_phase_metrics.py", ("prometheus",)),
    "app_key": _impl("server/test_metrics_collector.py"),
    # API
    "api_key": _impl("server/test_openai_api.py"),
    "max_request_bytes": _impl("reliability/test_stalls.py"),
    "max_sequences_per_request": _impl("server/test_admission.py"),
    "max_queued_requests": _impl("server/test_admission.py"),
    "max_queued_tokens": _impl("server/test_admission.py"),
    "enable_cache_report": _impl("server/test_openai_api.py"),
    "kv_events_config": _refused("KV cache events are not published by this build", "drop --kv-events-config"),
    # Data parallelism
    "data_parallel_size": _impl("server/test_data_parallel.py"),
    "load_balance_method": _impl("server/test_data_parallel.py"),
    "load_watch_interval": _impl(UNTESTED),
    # Expert parallelism
    "ep_size": _impl("server/test_parallel_server.py"),
    "init_expert_location": _impl("unit/test_tensor_parallel.py"),
    "ep_num_redundant_experts": _impl("unit/test_eplb.py"),
    "ep_dispatch_algorithm": _impl("server/test_parallel_server.py", DISPATCH_IMPLEMENTED),
    "eplb_algorithm": _impl("unit/test_eplb.py", EPLB_IMPLEMENTED),
    "expert_distribution_recorder_mode": _impl("unit/test_moe_recording.py"),
    "expert_distribution_recorder_buffer_size": _impl("unit/test_eplb.py"),
    "enable_expert_distribution_metrics": _impl("server/test_parallel_server.py"),
    "enable_eplb": _impl("server/test_parallel_server.py"),
    "eplb_rebalance_num_iterations": _impl("server/test_parallel_server.py"),
    # MoE backend
    "moe_backend": _impl("unit/test_moe_recording.py", MOE_IMPLEMENTED),
    "dense_gemv_backend": _impl("unit/test_dense_gemv_backend.py", DENSE_GEMV_IMPLEMENTED),
    "draft_moe_backend": _refused(
        "the only draft model (EAGLE3) is one dense decoder layer: it has no MoE", "drop --draft-moe-backend"
    ),
    "all2all_backend": _impl(UNTESTED, ALL2ALL_IMPLEMENTED),
    "deepep_mode": _inert("DeepEP is not built (--all2all-backend none is the only one), so it has no mode"),
    "disable_flashinfer_cutlass_moe_fp4_allgather": _inert("FP4 MoE is not implemented; there is no allgather"),
    # KVStore
    "enable_kvstore": _refused(_NO_KVSTORE, "leave enable_kvstore unset"),
    **dict.fromkeys(
        (
            "kvstore_ratio",
            "kvstore_size",
            "kvstore_io_backend",
            "kvstore_mem_layout",
            "kvstore_storage_backend",
            "kvstore_storage_backend_extra_config",
        ),
        _refused(_NO_KVSTORE, _KVSTORE_INSTEAD),
    ),
    "enable_mla_l1_5_cache": _refused(_NO_DEEPSEEK, "drop --enable-mla-l1-5-cache"),
    # Multi-node serving
    "dist_init_addr": _impl("server/test_worker_node.py"),
    "nnodes": _impl("server/test_worker_node.py"),
    "node_rank": _impl("server/test_worker_node.py"),
    # Model config overrides and sampling defaults
    "hf_overrides": _impl("engine/test_loader.py"),
    "preferred_sampling_params": _impl("server/test_api_support.py"),
    # Kernel backends
    "attention_backend": _impl("engine/test_attention.py", ATTENTION_IMPLEMENTED),
    "drafter_attention_backend": _impl("engine/test_speculative.py", ATTENTION_IMPLEMENTED),
    "sampling_backend": _impl("engine/test_sampling.py", SAMPLING_IMPLEMENTED),
    "dp_sampling": _inert("speculative verification runs on one rank: there is no batch to split"),
    "dp_sampling_min_bs": _inert("speculative verification runs on one rank: there is no batch to split"),
    "attention_use_fp4_indexer_cache": _inert(_NO_DEEPSEEK),
    "use_trtllm_ragged_deepseek_prefill": _inert(_NO_DEEPSEEK),
    "deepseek_v4_mega_moe_max_num_tokens": _inert(_NO_DEEPSEEK),
    "deepseek_v4_indexer_prefill_max_logits_mb": _inert(_NO_DEEPSEEK),
    "deepseek_v4_prefill_chunk_size": _inert(_NO_DEEPSEEK),
    # Structured output
    "grammar_backend": _impl("server/test_structured_output.py", GRAMMAR_IMPLEMENTED),
    "reasoning_parser": _impl("server/test_structured_output.py", REASONING_PARSERS_IMPLEMENTED),
    "tool_call_parser": _impl("server/test_structured_output.py", TOOL_PARSERS_IMPLEMENTED),
    "grammar_compile_timeout_secs": _impl("server/test_structured_output.py"),
    "grammar_compile_max_retries": Support(IMPLEMENTED, UNTESTED),
    "disable_any_whitespace": Support(IMPLEMENTED, UNTESTED),
    # the bitmask is applied by plain tensor ops inside the sampling step, the same with or without graphs
    "disable_capturable_grammar": _inert("one grammar path runs: the bitmask is applied inside the sampler"),
    # Speculative decoding
    "draft_model_path_use_base": _refused(
        "the draft model is never the base checkpoint: MTP layers are not in any supported architecture",
        "pass --speculative-draft-model-path DIR of an EAGLE3 draft",
    ),
    "speculative_config": _impl("engine/test_speculative.py"),
    "speculative_algorithm": _impl("engine/test_speculative.py", SPECULATIVE_IMPLEMENTED),
    "speculative_draft_model_path": _impl("engine/test_speculative.py"),
    "speculative_draft_model_quantization": _refused(
        "the draft model runs in the target's dtype; no quantized draft loader is built",
        "drop --speculative-draft-model-quantization",
    ),
    "speculative_num_steps": _impl("engine/test_speculative.py"),
    "speculative_eagle_topk": _impl("engine/test_speculative.py"),
    "speculative_num_draft_tokens": _impl("engine/test_speculative.py"),
    "speculative_ngram_min_match_window_size": _impl("unit/test_speculative_parts.py"),
    "speculative_ngram_max_match_window_size": _impl("unit/test_speculative_parts.py"),
    "eagle3_layers_to_capture": _impl("engine/test_speculative.py"),
    "enable_output_logprobs": _impl("server/test_client_fields.py"),
    # Runtime options
    "disable_pdl": _inert("no kernel here is launched with programmatic dependent launch"),
    "enable_prefix_caching": _impl("engine/test_engine_correctness.py"),
    "disable_kvstore": _inert("there is no KVStore tier, so it is always off"),
    "enforce_eager": _impl("gpu/test_engine_gpu.py"),
    "disable_cuda_graph_padding": _impl("unit/test_gpu_fast_path_config.py"),
    "enable_cudagraph_gc": _impl(UNTESTED),
    "enable_nccl_nvls": _inert(_NO_FUSED_COMM),
    "enable_symm_mem": _inert(_NO_FUSED_COMM),
    "disable_custom_all_reduce": _inert("there is no custom all-reduce kernel: NCCL always runs"),
    "disable_overlap_schedule": _impl("engine/test_overlap_schedule.py"),
    "disable_tf32": _inert("the server never turns TF32 on, so there is nothing to disable"),
    "force_deterministic_rsag": _inert(_NO_FUSED_COMM),
    "disable_sampling_tp_sync": _inert(
        "sampled tokens are never broadcast over the TP group: every rank samples the same logits with the same seeds"
    ),
    "low_latency_max_num_tokens_per_gpu": _inert("low-latency (DeepEP) MoE dispatch is not built"),
    "max_cudagraph_capture_size": _impl("gpu/test_engine_gpu.py"),
    "disable_prefill_graph": _inert(_NO_PREFILL_GRAPH),
    "prefill_graph_max_tokens": _inert(_NO_PREFILL_GRAPH),
    "prefill_graph_capture_sizes": _inert(_NO_PREFILL_GRAPH),
    "cudagraph_capture_sizes": _impl("gpu/test_engine_gpu.py"),
    "enable_nan_detection": _impl("engine/test_sampling.py"),
    "enable_nvtx": _inert("no NVTX ranges are emitted by this build"),
    "enable_p2p_check": _inert("peer access is never probed: NCCL decides the transport itself"),
    "triton_attention_reduce_in_fp32": _impl("gpu/test_attention_backends.py"),
    "delete_ckpt_after_loading": _inert("checkpoint files are never deleted by the server"),
    "weight_loader_prefetch_checkpoints": _inert(_NO_PREFETCH),
    "weight_loader_prefetch_num_threads": _inert(_NO_PREFETCH),
    "enable_memory_saver": _inert("there is no release/resume memory endpoint to allow"),
    "enable_custom_logit_processor": _refused(
        "requests cannot carry custom logit processors in this build", "drop --enable-custom-logit-processor"
    ),
    "mla_disable_ragged": _inert(_NO_DEEPSEEK),
    "warmups": _impl("server/test_lifecycle.py"),
    # Parallel layout
    "nprocs_per_node": _impl("unit/test_mapping.py"),
    "world_size": _impl("unit/test_mapping.py"),
    "attn_tp_size": _impl("server/test_parallel_server.py"),
    "dense_tp_size": _impl("unit/test_tensor_parallel.py"),
    "moe_tp_size": _impl("unit/test_tensor_parallel.py"),
    "mapping": _impl("unit/test_mapping.py"),
    "mla_chunk_multiplier": _inert(_NO_DEEPSEEK),
    "mm_attention_backend": _inert("every model this build serves is text-only: there is no encoder"),
    # Disaggregated serving
    "disaggregation_mode": Support(REFUSED, _NO_DISAGG, "serve prefill and decode in one server (null)"),
    "disaggregation_bootstrap_port": _inert(_NO_DISAGG),
    "disaggregation_transfer_backend": _inert(_NO_DISAGG),
    "disaggregation_ib_device": _inert(_NO_DISAGG),
    "disaggregation_layerwise_interval": _inert(_NO_DISAGG),
    "pdlb_url": _refused(
        f"{_NO_DISAGG}: the server would never register with the load balancer", "drop --pdlb-url"
    ),
    "skip_server_warmup": _impl("server/test_data_parallel.py"),
    # Fused communication + norm
    "comm_fusion_max_num_tokens": _inert(_NO_FUSED_COMM),
    "enable_allreduce_fusion": _inert(_NO_FUSED_COMM),
    "enable_expert_parallel": _impl("unit/test_mapping.py"),
}
