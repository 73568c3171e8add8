"""Every flag of the seed's ``tokenspeed serve`` parses, with its aliases and choices, into its field.

The table below lists each flag spelling of the upstream specification with a sample value and the field
value it must produce; it is checked against the parser built from ``ServerArgs``.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from tokenspeed.config.cli import CLI_ALIAS_DESTS, build_parser, namespace_to_fields
from tokenspeed.config.flags import str_to_bool
from tokenspeed.config.server_args import ServerArgs

# (argv after the positional model, field, expected value)
SEED_FLAG_TABLE = [
    (["MODEL"], "model", "MODEL"),
    (["--model", "MODEL"], "model", "MODEL"),
    (["--model-path", "MODEL"], "model", "MODEL"),
    (["--tokenizer", "text"], "tokenizer", "text"),
    (["--host", "text"], "host", "text"),
    (["--port", "7"], "port", 7),
    (["--tokenizer-mode", "auto"], "tokenizer_mode", "auto"),
    (["--tokenizer-mode", "slow"], "tokenizer_mode", "slow"),
    (["--tokenizer-mode", "deepseek_v4"], "tokenizer_mode", "deepseek_v4"),
    (["--skip-tokenizer-init"], "skip_tokenizer_init", True),
    (["--no-skip-tokenizer-init"], "skip_tokenizer_init", False),
    (["--language-model-only"], "language_model_only", True),
    (["--ext-yaml", "text"], "ext_yaml", "text"),
    (["--load-format", "auto"], "load_format", "auto"),
    (["--load-format", "pt"], "load_format", "pt"),
    (["--load-format", "safetensors"], "load_format", "safetensors"),
    (["--load-format", "npcache"], "load_format", "npcache"),
    (["--load-format", "dummy"], "load_format", "dummy"),
    (["--load-format", "extensible"], "load_format", "extensible"),
    (["--trust-remote-code"], "trust_remote_code", True),
    (["--no-trust-remote-code"], "trust_remote_code", False),
    (["--dtype", "auto"], "dtype", "auto"),
    (["--dtype", "half"], "dtype", "half"),
    (["--dtype", "float16"], "dtype", "float16"),
    (["--dtype", "bfloat16"], "dtype", "bfloat16"),
    (["--dtype", "float"], "dtype", "float"),
    (["--dtype", "float32"], "dtype", "float32"),
    (["--kv-cache-dtype", "auto"], "kv_cache_dtype", "auto"),
    (["--kv-cache-dtype", "fp8"], "kv_cache_dtype", "fp8"),
    (["--kv-cache-dtype", "fp8_e4m3"], "kv_cache_dtype", "fp8_e4m3"),
    (["--kv-cache-quant-method", "none"], "kv_cache_quant_method", "none"),
    (["--kv-cache-quant-method", "per_token_head"], "kv_cache_quant_method", "per_token_head"),
    (["--quantization", "fp8"], "quantization", "fp8"),
    (["--quantization", "mxfp4"], "quantization", "mxfp4"),
    (["--quantization", "nvfp4"], "quantization", "nvfp4"),
    (["--quantization", "w8a8_fp8"], "quantization", "w8a8_fp8"),
    (["--quantization", "compressed-tensors"], "quantization", "compressed-tensors"),
    (["--quantization-param-path", "text"], "quantization_param_path", "text"),
    (["--max-model-len", "7"], "max_model_len", 7),
    (["--device", "cuda"], "device", "cuda"),
    # Beyond the seed: serving without a GPU.
    (["--device", "cpu"], "device", "cpu"),
    (["--cpu-kv-cache-memory-gb", "0.5"], "cpu_kv_cache_memory_gb", 0.5),
    (["--max-request-bytes", "1024"], "max_request_bytes", 1024),
    (["--max-sequences-per-request", "8"], "max_sequences_per_request", 8),
    (["--max-queued-requests", "16"], "max_queued_requests", 16),
    (["--max-queued-tokens", "4096"], "max_queued_tokens", 4096),
    (["--dense-gemv-backend", "torch"], "dense_gemv_backend", "torch"),
    (["--tool-call-parser", "hermes"], "tool_call_parser", "hermes"),
    (["--disable-cuda-graph"], "enforce_eager", True),
    (["--served-model-name", "text"], "served_model_name", "text"),
    (["--revision", "text"], "revision", "text"),
    (["--gpu-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
    (["--max-num-seqs", "7"], "max_num_seqs", 7),
    (["--max-total-tokens", "7"], "max_total_tokens", 7),
    (["--chunked-prefill-size", "7"], "chunked_prefill_size", 7),
    (["--enable-mixed-batch"], "enable_mixed_batch", True),
    (["--block-size", "7"], "block_size", 7),
    (["--disable-kvstore"], "disable_kvstore", True),
    (["--kvstore-ratio", "0.5"], "kvstore_ratio", 0.5),
    (["--kvstore-size", "7"], "kvstore_size", 7),
    (["--kvstore-io-backend", "direct"], "kvstore_io_backend", "direct"),
    (["--kvstore-io-backend", "kernel"], "kvstore_io_backend", "kernel"),
    (["--kvstore-mem-layout", "layer_first"], "kvstore_mem_layout", "layer_first"),
    (["--kvstore-mem-layout", "page_first"], "kvstore_mem_layout", "page_first"),
    (["--kvstore-mem-layout", "page_head"], "kvstore_mem_layout", "page_head"),
    (["--kvstore-storage-backend", "mooncake"], "kvstore_storage_backend", "mooncake"),
    (["--kvstore-storage-backend-extra-config", "text"], "kvstore_storage_backend_extra_config", "text"),
    (["--enable-mla-l1-5-cache"], "enable_mla_l1_5_cache", True),
    (["--mamba-ssm-dtype", "float32"], "mamba_ssm_dtype", "float32"),
    (["--mamba-ssm-dtype", "bfloat16"], "mamba_ssm_dtype", "bfloat16"),
    (["--mamba-track-interval", "7"], "mamba_track_interval", 7),
    (["--max-mamba-cache-size", "7"], "max_mamba_cache_size", 7),
    (["--mamba-full-memory-ratio", "0.5"], "mamba_full_memory_ratio", 0.5),
    (["--enable-mamba-l2"], "enable_mamba_l2", True),
    (["--mamba-l2-host-slots", "7"], "mamba_l2_host_slots", 7),
    (["--mamba-l2-ratio", "0.5"], "mamba_l2_ratio", 0.5),
    (["--mamba-l2-layout", "layer_first"], "mamba_l2_layout", "layer_first"),
    (["--mamba-l2-io-backend", "direct"], "mamba_l2_io_backend", "direct"),
    (["--mamba-l2-io-backend", "kernel"], "mamba_l2_io_backend", "kernel"),
    (["--mamba-l2-host-gb", "7"], "mamba_l2_host_gb", 7),
    (["--max-prefill-tokens", "7"], "max_prefill_tokens", 7),
    (["--stream-interval", "7"], "stream_interval", 7),
    (["--stream-output"], "stream_output", True),
    (["--seed", "7"], "seed", 7),
    (["--distributed-timeout-seconds", "7"], "distributed_timeout_seconds", 7),
    (["--download-dir", "text"], "download_dir", "text"),
    (["--base-gpu-id", "7"], "base_gpu_id", 7),
    (["--gpu-id-step", "7"], "gpu_id_step", 7),
    (["--log-level", "text"], "log_level", "text"),
    (["--log-level-http", "text"], "log_level_http", "text"),
    (["--enable-log-requests"], "enable_log_requests", True),
    (["--no-enable-log-requests"], "enable_log_requests", False),
    (["--log-requests-level", "0"], "log_requests_level", 0),
    (["--log-requests-level", "1"], "log_requests_level", 1),
    (["--log-requests-level", "2"], "log_requests_level", 2),
    (["--enable-log-request-stats"], "enable_log_request_stats", True),
    (["--no-enable-log-request-stats"], "enable_log_request_stats", False),
    (["--enable-metrics"], "enable_metrics", True),
    (["--metrics-reporters", "prometheus"], "metrics_reporters", ["prometheus"]),
    (["--app-key", "text"], "app_key", "text"),
    (["--decode-log-interval", "7"], "decode_log_interval", 7),
    (["--api-key", "text"], "api_key", "text"),
    (["--enable-cache-report"], "enable_cache_report", True),
    (["--kv-events-config", "text"], "kv_events_config", "text"),
    (["--data-parallel-size", "7"], "data_parallel_size", 7),
    (["--load-balance-method", "round_robin"], "load_balance_method", "round_robin"),
    (["--load-balance-method", "shortest_queue"], "load_balance_method", "shortest_queue"),
    (["--load-balance-method", "minimum_cache_usage"], "load_balance_method", "minimum_cache_usage"),
    (["--load-watch-interval", "0.5"], "load_watch_interval", 0.5),
    (["--expert-parallel-size", "7"], "ep_size", 7),
    (["--ep-size", "7"], "ep_size", 7),
    (["--init-expert-location", "text"], "init_expert_location", "text"),
    (["--ep-num-redundant-experts", "7"], "ep_num_redundant_experts", 7),
    (["--ep-dispatch-algorithm", "dynamic"], "ep_dispatch_algorithm", "dynamic"),
    (["--eplb-algorithm", "text"], "eplb_algorithm", "text"),
    (["--expert-distribution-recorder-mode", "per_pass"], "expert_distribution_recorder_mode", "per_pass"),
    (["--expert-distribution-recorder-buffer-size", "7"], "expert_distribution_recorder_buffer_size", 7),
    (["--enable-expert-distribution-metrics"], "enable_expert_distribution_metrics", True),
    (["--enable-eplb"], "enable_eplb", True),
    (["--eplb-rebalance-num-iterations", "50"], "eplb_rebalance_num_iterations", 50),
    (["--moe-backend", "text"], "moe_backend", "text"),
    (["--draft-moe-backend", "text"], "draft_moe_backend", "text"),
    (["--all2all-backend", "text"], "all2all_backend", "text"),
    (["--deepep-mode", "normal"], "deepep_mode", "normal"),
    (["--deepep-mode", "low_latency"], "deepep_mode", "low_latency"),
    (["--deepep-mode", "auto"], "deepep_mode", "auto"),
    (
        ["--disable-flashinfer-cutlass-moe-fp4-allgather"],
        "disable_flashinfer_cutlass_moe_fp4_allgather",
        True,
    ),
    (["--dist-init-addr", "text"], "dist_init_addr", "text"),
    (["--nnodes", "7"], "nnodes", 7),
    (["--node-rank", "7"], "node_rank", 7),
    (["--hf-overrides", "text"], "hf_overrides", "text"),
    (["--preferred-sampling-params", "text"], "preferred_sampling_params", "text"),
    (["--attention-backend", "mha"], "attention_backend", "mha"),
    (["--attention-backend", "mla"], "attention_backend", "mla"),
    (["--attention-backend", "fa3"], "attention_backend", "fa3"),
    (["--attention-backend", "fa4"], "attention_backend", "fa4"),
    (["--attention-backend", "triton"], "attention_backend", "triton"),
    (["--attention-backend", "flashinfer"], "attention_backend", "flashinfer"),
    (["--attention-backend", "trtllm"], "attention_backend", "trtllm"),
    (["--attention-backend", "trtllm_mla"], "attention_backend", "trtllm_mla"),
    (["--attention-backend", "flashmla"], "attention_backend", "flashmla"),
    (["--attention-backend", "tokenspeed_mla"], "attention_backend", "tokenspeed_mla"),
    (["--attention-backend", "hybrid_linear_attn"], "attention_backend", "hybrid_linear_attn"),
    (["--drafter-attention-backend", "mha"], "drafter_attention_backend", "mha"),
    (["--drafter-attention-backend", "mla"], "drafter_attention_backend", "mla"),
    (["--drafter-attention-backend", "fa3"], "drafter_attention_backend", "fa3"),
    (["--drafter-attention-backend", "fa4"], "drafter_attention_backend", "fa4"),
    (["--drafter-attention-backend", "triton"], "drafter_attention_backend", "triton"),
    (["--drafter-attention-backend", "flashinfer"], "drafter_attention_backend", "flashinfer"),
    (["--drafter-attention-backend", "trtllm"], "drafter_attention_backend", "trtllm"),
    (["--drafter-attention-backend", "trtllm_mla"], "drafter_attention_backend", "trtllm_mla"),
    (["--drafter-attention-backend", "flashmla"], "drafter_attention_backend", "flashmla"),
    (["--drafter-attention-backend", "tokenspeed_mla"], "drafter_attention_backend", "tokenspeed_mla"),
    (
        ["--drafter-attention-backend", "hybrid_linear_attn"],
        "drafter_attention_backend",
        "hybrid_linear_attn",
    ),
    (["--sampling-backend", "greedy"], "sampling_backend", "greedy"),
    (["--sampling-backend", "flashinfer"], "sampling_backend", "flashinfer"),
    (["--sampling-backend", "flashinfer_full"], "sampling_backend", "flashinfer_full"),
    (["--sampling-backend", "triton"], "sampling_backend", "triton"),
    (["--sampling-backend", "triton_full"], "sampling_backend", "triton_full"),
    (["--dp-sampling"], "dp_sampling", True),
    (["--dp-sampling-min-bs", "7"], "dp_sampling_min_bs", 7),
    (["--attention-use-fp4-indexer-cache"], "attention_use_fp4_indexer_cache", True),
    (["--attention-use-fp4-indexer-cache", "false"], "attention_use_fp4_indexer_cache", False),
    (["--attention-use-fp4-indexer-cache=on"], "attention_use_fp4_indexer_cache", True),
    (["--attention-config.use-fp4-indexer-cache"], "attention_use_fp4_indexer_cache", True),
    (["--attention-config.use-fp4-indexer-cache", "false"], "attention_use_fp4_indexer_cache", False),
    (["--attention-config.use-fp4-indexer-cache=on"], "attention_use_fp4_indexer_cache", True),
    (["--attention_config.use_fp4_indexer_cache"], "attention_use_fp4_indexer_cache", True),
    (["--attention_config.use_fp4_indexer_cache", "false"], "attention_use_fp4_indexer_cache", False),
    (["--attention_config.use_fp4_indexer_cache=on"], "attention_use_fp4_indexer_cache", True),
    (["--attention-config.use-trtllm-ragged-deepseek-prefill"], "use_trtllm_ragged_deepseek_prefill", True),
    (
        ["--attention-config.use-trtllm-ragged-deepseek-prefill", "false"],
        "use_trtllm_ragged_deepseek_prefill",
        False,
    ),
    (
        ["--attention-config.use-trtllm-ragged-deepseek-prefill=on"],
        "use_trtllm_ragged_deepseek_prefill",
        True,
    ),
    (["--attention-config.use_trtllm_ragged_deepseek_prefill"], "use_trtllm_ragged_deepseek_prefill", True),
    (
        ["--attention-config.use_trtllm_ragged_deepseek_prefill", "false"],
        "use_trtllm_ragged_deepseek_prefill",
        False,
    ),
    (
        ["--attention-config.use_trtllm_ragged_deepseek_prefill=on"],
        "use_trtllm_ragged_deepseek_prefill",
        True,
    ),
    (["--attention_config.use_trtllm_ragged_deepseek_prefill"], "use_trtllm_ragged_deepseek_prefill", True),
    (
        ["--attention_config.use_trtllm_ragged_deepseek_prefill", "false"],
        "use_trtllm_ragged_deepseek_prefill",
        False,
    ),
    (
        ["--attention_config.use_trtllm_ragged_deepseek_prefill=on"],
        "use_trtllm_ragged_deepseek_prefill",
        True,
    ),
    (["--deepseek-v4-mega-moe-max-num-tokens", "7"], "deepseek_v4_mega_moe_max_num_tokens", 7),
    (["--deepseek-v4-indexer-prefill-max-logits-mb", "7"], "deepseek_v4_indexer_prefill_max_logits_mb", 7),
    (["--deepseek-v4-prefill-chunk-size", "7"], "deepseek_v4_prefill_chunk_size", 7),
    (["--grammar-backend", "xgrammar"], "grammar_backend", "xgrammar"),
    (["--grammar-backend", "none"], "grammar_backend", "none"),
    (["--reasoning-parser", "qwen3"], "reasoning_parser", "qwen3"),
    (["--grammar-compile-timeout-secs", "0.5"], "grammar_compile_timeout_secs", 0.5),
    (["--grammar-compile-max-retries", "7"], "grammar_compile_max_retries", 7),
    (["--disable-any-whitespace"], "disable_any_whitespace", True),
    (["--disable-capturable-grammar"], "disable_capturable_grammar", True),
    (["--mla-disable-ragged"], "mla_disable_ragged", True),
    (["--draft-model-path-use-base"], "draft_model_path_use_base", True),
    (["--speculative-config", "text"], "speculative_config", "text"),
    (["--speculative_config", "text"], "speculative_config", "text"),
    (["--speculative-algorithm", "EAGLE3"], "speculative_algorithm", "EAGLE3"),
    (["--speculative-algorithm", "MTP"], "speculative_algorithm", "MTP"),
    (["--speculative-algorithm", "DFLASH"], "speculative_algorithm", "DFLASH"),
    (["--speculative-draft-model-path", "text"], "speculative_draft_model_path", "text"),
    (["--speculative-draft-model-quantization", "text"], "speculative_draft_model_quantization", "text"),
    (["--speculative-num-steps", "7"], "speculative_num_steps", 7),
    (["--speculative-eagle-topk", "1"], "speculative_eagle_topk", 1),
    (["--speculative-num-draft-tokens", "7"], "speculative_num_draft_tokens", 7),
    (["--enable-output-logprobs"], "enable_output_logprobs", True),
    (["--disable-output-logprobs"], "enable_output_logprobs", False),
    (["--eagle3-layers-to-capture", "text"], "eagle3_layers_to_capture", "text"),
    (["--disable-pdl"], "disable_pdl", True),
    (["--enable-prefix-caching"], "enable_prefix_caching", True),
    (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
    (["--enforce-eager"], "enforce_eager", True),
    (["--disable-cuda-graph-padding"], "disable_cuda_graph_padding", True),
    (["--enable-cudagraph-gc"], "enable_cudagraph_gc", True),
    (["--enable-nccl-nvls"], "enable_nccl_nvls", True),
    (["--enable-symm-mem"], "enable_symm_mem", True),
    (["--disable-custom-all-reduce"], "disable_custom_all_reduce", True),
    (["--disable-overlap-schedule"], "disable_overlap_schedule", True),
    (["--disable-tf32"], "disable_tf32", True),
    (["--max-cudagraph-capture-size", "7"], "max_cudagraph_capture_size", 7),
    (["--cudagraph-capture-sizes", "1", "2"], "cudagraph_capture_sizes", [1, 2]),
    (["--disable-prefill-graph"], "disable_prefill_graph", True),
    (["--prefill-graph-max-tokens", "7"], "prefill_graph_max_tokens", 7),
    (["--prefill-graph-capture-sizes", "1", "2"], "prefill_graph_capture_sizes", [1, 2]),
    (["--enable-nan-detection"], "enable_nan_detection", True),
    (["--enable-nvtx"], "enable_nvtx", True),
    (["--enable-p2p-check"], "enable_p2p_check", True),
    (["--triton-attention-reduce-in-fp32"], "triton_attention_reduce_in_fp32", True),
    (["--delete-ckpt-after-loading"], "delete_ckpt_after_loading", True),
    (["--weight-loader-prefetch-checkpoints"], "weight_loader_prefetch_checkpoints", True),
    (["--weight-loader-prefetch-num-threads", "7"], "weight_loader_prefetch_num_threads", 7),
    (["--enable-memory-saver"], "enable_memory_saver", True),
    (["--enable-custom-logit-processor"], "enable_custom_logit_processor", True),
    (["--skip-server-warmup"], "skip_server_warmup", True),
    (["--warmups", "text"], "warmups", "text"),
    (["--tensor-parallel-size", "7"], "attn_tp_size", 7),
    (["--tp", "7"], "attn_tp_size", 7),
    (["--enable-expert-parallel"], "enable_expert_parallel", True),
    (["--attn-tp-size", "7"], "attn_tp_size", 7),
    (["--dense-tp-size", "7"], "dense_tp_size", 7),
    (["--moe-tp-size", "7"], "moe_tp_size", 7),
    (["--nprocs-per-node", "7"], "nprocs_per_node", 7),
    (["--world-size", "7"], "world_size", 7),
    (["--force-deterministic-rsag"], "force_deterministic_rsag", True),
    (["--disable-sampling-tp-sync"], "disable_sampling_tp_sync", True),
    (["--low-latency-max-num-tokens-per-gpu", "7"], "low_latency_max_num_tokens_per_gpu", 7),
    (["--mla-chunk-multiplier", "7"], "mla_chunk_multiplier", 7),
    (["--mm-attention-backend", "fa3"], "mm_attention_backend", "fa3"),
    (["--mm-attention-backend", "fa4"], "mm_attention_backend", "fa4"),
    (["--mm-attention-backend", "triton_attn"], "mm_attention_backend", "triton_attn"),
    (["--mm-attention-backend", "flashinfer_cudnn"], "mm_attention_backend", "flashinfer_cudnn"),
    (["--disaggregation-mode", "null"], "disaggregation_mode", "null"),
    (["--disaggregation-mode", "prefill"], "disaggregation_mode", "prefill"),
    (["--disaggregation-mode", "decode"], "disaggregation_mode", "decode"),
    (["--disaggregation-mode", "encode"], "disaggregation_mode", "encode"),
    (["--comm-fusion-max-num-tokens", "7"], "comm_fusion_max_num_tokens", 7),
    (["--enable-allreduce-fusion"], "enable_allreduce_fusion", True),
    (["--disaggregation-bootstrap-port", "7"], "disaggregation_bootstrap_port", 7),
    (["--disaggregation-transfer-backend", "mooncake"], "disaggregation_transfer_backend", "mooncake"),
    (
        ["--disaggregation-transfer-backend", "mooncake_async"],
        "disaggregation_transfer_backend",
        "mooncake_async",
    ),
    (["--disaggregation-ib-device", "text"], "disaggregation_ib_device", "text"),
    (["--disaggregation-layerwise-interval", "7"], "disaggregation_layerwise_interval", 7),
    (["--pdlb-url", "text"], "pdlb_url", "text"),
]

# Fields that have no flag on purpose: detokenization is always inline, the KVStore switch is derived
# from --disable-kvstore and the disaggregation mode, and the mapping is resolved from the sizes.
FIELDS_WITHOUT_FLAG = {"enable_inline_detokenizer", "enable_kvstore", "mapping"}


def parse_fields(argv: list[str]) -> dict:
    return namespace_to_fields(build_parser().parse_args(argv))


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.mark.parametrize(
    ("argv", "field", "expected"), SEED_FLAG_TABLE, ids=[" ".join(r[0]) for r in SEED_FLAG_TABLE]
)
def test_seed_flag_parses_into_field(argv, field, expected):
    if field != "model":
        argv = ["MODEL", *argv]
    fields = parse_fields(argv)
    assert fields[field] == expected


def test_table_covers_every_flag_of_the_parser(parser):
    """Every option of the parser is either in the seed table or one of our documented additions."""
    in_table = {a.split("=")[0] for argv, _, _ in SEED_FLAG_TABLE for a in argv if a.startswith("-")}
    # --api-key-file gives api_key from a file (tests/reliability/test_api_key_secrets.py).
    # The NGRAM match windows (SGLang's spelling) size prompt lookup (tests/unit/test_speculative_parts.py).
    ours = {
        "-h",
        "--help",
        "--api-key-file",
        "--speculative-ngram-min-match-window-size",
        "--speculative-ngram-max-match-window-size",
    }
    options = {s for action in parser._actions for s in action.option_strings}
    assert options - in_table == ours


def test_every_parser_dest_is_a_field(parser):
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.dest in names or action.dest in CLI_ALIAS_DESTS, action.dest


def test_every_field_has_a_flag(parser):
    dests = {CLI_ALIAS_DESTS.get(a.dest, a.dest) for a in parser._actions}
    missing = {f.name for f in dataclasses.fields(ServerArgs)} - dests
    assert missing == FIELDS_WITHOUT_FLAG


def test_parser_defaults_are_the_field_defaults(parser):
    defaults = {
        f.name: f.default for f in dataclasses.fields(ServerArgs) if f.default is not dataclasses.MISSING
    }
    for action in parser._actions:
        if action.dest in defaults and action.dest != "metrics_reporters":
            assert action.default == defaults[action.dest], action.dest


def test_no_flag_keeps_every_default():
    fields = parse_fields(["MODEL"])
    defaults = {
        f.name: f.default for f in dataclasses.fields(ServerArgs) if f.default is not dataclasses.MISSING
    }
    for name, value in fields.items():
        if name == "metrics_reporters":
            assert value == ["prometheus"]
        elif name != "model":
            assert value == defaults[name], name


def test_trust_remote_code_is_off_by_default():
    assert parse_fields(["MODEL"])["trust_remote_code"] is False
    assert ServerArgs(model="m", device="cpu").trust_remote_code is False


@pytest.mark.parametrize(
    ("flag", "bad"),
    [
        ("--tokenizer-mode", "fast"),
        ("--load-format", "gguf"),
        ("--dtype", "int8"),
        ("--kv-cache-dtype", "fp16"),
        ("--quantization", "awq"),
        ("--device", "tpu"),
        ("--kvstore-io-backend", "mmap"),
        ("--kvstore-mem-layout", "head_first"),
        ("--log-requests-level", "3"),
        ("--load-balance-method", "random"),
        ("--attention-backend", "xformers"),
        ("--sampling-backend", "beam"),
        ("--speculative-algorithm", "MEDUSA"),
        ("--speculative-eagle-topk", "2"),
        ("--disaggregation-mode", "both"),
        ("--metrics-reporters", "statsd"),
        # Typed as literals in the seed's dataclass; the parser enforces them too.
        ("--ep-dispatch-algorithm", "random"),
        ("--expert-distribution-recorder-mode", "full"),
        ("--tp", "two"),
        ("--gpu-memory-utilization", "lots"),
        ("--attention-use-fp4-indexer-cache", "maybe"),
    ],
)
def test_values_outside_choices_are_rejected(flag, bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["MODEL", flag, bad])
    assert flag in capsys.readouterr().err


def test_abbreviations_are_not_accepted():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["MODEL", "--max-num"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["A", "--model", "B"], "given twice"),
        ([], "model is required"),
        (["M", "--tp", "2", "--attn-tp-size", "2"], "--attn-tp-size"),
    ],
)
def test_alias_conflicts(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_fields(argv)


def test_prefix_caching_flags_are_mutually_exclusive():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["M", "--enable-prefix-caching", "--no-enable-prefix-caching"])


def test_repeated_metrics_reporter_counted_once():
    fields = parse_fields(["M", "--metrics-reporters", "prometheus", "--metrics-reporters", "prometheus"])
    assert fields["metrics_reporters"] == ["prometheus"]


def test_absent_ep_size_is_one():
    assert parse_fields(["M"])["ep_size"] == 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("off", False),
        (True, True),
        (False, False),
    ],
)
def test_str_to_bool(text, value):
    assert str_to_bool(text) is value


def test_str_to_bool_rejects_other_words():
    with pytest.raises(argparse.ArgumentTypeError):
        str_to_bool("maybe")


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser(prog="tokenspeed serve").parse_args(["--help"])
    out = capsys.readouterr().out
    for argv, _, _ in SEED_FLAG_TABLE:
        flag = argv[0].split("=")[0]
        if flag.startswith("--"):
            assert flag in out
