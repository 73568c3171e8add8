"""The settings of one server, as declared: ``ServerFields``, the fields of ``ServerArgs``.

Field names, defaults and types follow the upstream engine's server arguments, so a command line written
for it works here. This module only declares them; the rules that fill and check them
(``config.resolve``, ``config.validate``) read this class, and ``config.server_args`` adds resolution on
construction. A field typed ``Literal[...]`` spells its flag's choices there once (``config.flags``
reads them back).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from tokenspeed.runtime.distributed.mapping import Mapping

__all__ = ["FLA_CHUNK_SIZE", "ServerFields", "declared_choices", "type_alternatives"]

# Chunk length of the linear-attention (FLA) kernels; the Mamba cache must align to it.
FLA_CHUNK_SIZE = 64


@dataclasses.dataclass
class ServerFields:
    """Every setting of one server, unresolved: build a ``ServerArgs`` (which resolves and freezes them)
    rather than this class."""

    # Model and tokenizer
    model: str
    tokenizer: str | None = None
    tokenizer_mode: str = "auto"
    skip_tokenizer_init: bool = False
    load_format: str = "auto"
    # Off unless asked for: running a checkpoint's own Python code is a decision for the operator.
    trust_remote_code: bool = False
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    kv_cache_quant_method: str = "none"
    quantization: str | None = None
    quantization_param_path: str | None = None
    max_model_len: int | None = None
    device: str = "cuda"
    served_model_name: str | None = None
    revision: str | None = None
    language_model_only: bool = False

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 8000

    # Memory and scheduling
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 8192
    enable_mixed_batch: bool = False
    block_size: int = 64
    # Size of the KV pool when the device is the CPU and --max-total-tokens is unset.
    cpu_kv_cache_memory_gb: float = 1.0

    # State caches of linear-attention (Mamba) layers
    mamba_ssm_dtype: str = "float32"
    mamba_track_interval: int = 256
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float = 0.9
    enable_mamba_l2: bool = False
    mamba_l2_host_slots: int = 0
    mamba_l2_ratio: float = 2.0
    mamba_l2_layout: str = "layer_first"
    mamba_l2_io_backend: str = "kernel"
    mamba_l2_host_gb: int = 0

    # Other runtime options
    stream_interval: int = 1
    stream_output: bool = False
    # Detokenization always runs inline in the HTTP process; kept as a field (no flag) for callers that
    # read it.
    enable_inline_detokenizer: bool = True
    seed: int | None = None
    distributed_timeout_seconds: int | None = None
    download_dir: str | None = None
    ext_yaml: str | None = None
    base_gpu_id: int = 0
    gpu_id_step: int = 1

    # Logging and metrics
    log_level: str = "info"
    log_level_http: str | None = None
    enable_log_requests: bool = False
    log_requests_level: int = 0
    enable_log_request_stats: bool = False
    enable_metrics: bool = False
    decode_log_interval: int = 40
    metrics_reporters: list[str] | None = None
    app_key: str | None = None

    # API
    api_key: str | None = None
    # Largest HTTP request body accepted (TokenSpeed's own flag): bigger ones get 413 before being read.
    max_request_bytes: int = 4 * 1024 * 1024
    # TokenSpeed's own admission bounds: sequences (prompts x n) one request may ask for, and what the
    # server holds at once (sequences, prompt tokens; None: 8x the KV cache) before answering 503.
    max_sequences_per_request: int = 1024
    max_queued_requests: int = 4096
    max_queued_tokens: int | None = None
    enable_cache_report: bool = False
    kv_events_config: str | None = None

    # Data parallelism
    data_parallel_size: int | None = None
    load_balance_method: str = "shortest_queue"
    load_watch_interval: float = 0.02

    # Expert parallelism
    ep_size: int = 1
    init_expert_location: str = "trivial"
    ep_num_redundant_experts: int = 0
    ep_dispatch_algorithm: (
        Literal["static", "dynamic", "fake", "static_with_zero_expert", "dynamic_with_zero_expert"] | None
    ) = None
    eplb_algorithm: str = "auto"
    expert_distribution_recorder_mode: Literal["stat", "stat_approx", "per_pass", "per_token"] | None = None
    expert_distribution_recorder_buffer_size: int | None = None
    enable_expert_distribution_metrics: bool = False
    enable_eplb: bool = False
    eplb_rebalance_num_iterations: int = 1000

    # MoE backend
    moe_backend: str = "auto"
    # bf16/fp16 linears and the LM head at decode batches of 1-4 rows (TokenSpeed's own flag):
    # auto | triton (the Triton GEMV) | torch (F.linear, cuBLAS)
    dense_gemv_backend: str = "auto"
    draft_moe_backend: str | None = None
    all2all_backend: str = "none"
    deepep_mode: Literal["normal", "low_latency", "auto"] = "auto"
    disable_flashinfer_cutlass_moe_fp4_allgather: bool = False

    # KVStore (host-memory tier behind the device KV pool)
    enable_kvstore: bool = False
    kvstore_ratio: float = 2.0
    kvstore_size: int = 0
    kvstore_io_backend: str = "kernel"
    kvstore_mem_layout: str = "layer_first"
    kvstore_storage_backend: str | None = None
    kvstore_storage_backend_extra_config: str | None = None
    enable_mla_l1_5_cache: bool = False

    # Multi-node serving
    dist_init_addr: str | None = None
    nnodes: int = 1
    node_rank: int = 0

    # Model config overrides (JSON object)
    hf_overrides: str = "{}"
    preferred_sampling_params: str | None = None

    # Kernel backends
    attention_backend: str | None = None
    drafter_attention_backend: str | None = None
    sampling_backend: str | None = None
    dp_sampling: bool = False
    dp_sampling_min_bs: int | None = None
    attention_use_fp4_indexer_cache: bool | None = None
    use_trtllm_ragged_deepseek_prefill: bool | None = None

    # DeepSeek V4
    deepseek_v4_mega_moe_max_num_tokens: int = 0
    deepseek_v4_indexer_prefill_max_logits_mb: int = 512
    deepseek_v4_prefill_chunk_size: int = 4

    # Structured output: on by default, as clients of vLLM expect (the seed's default is "none")
    grammar_backend: str = "xgrammar"
    # Lets json_schema grammars start after the model's reasoning section.
    reasoning_parser: str | None = None
    # How tool calls are read from the model's text (vLLM/SGLang's --tool-call-parser; TokenSpeed's own here).
    tool_call_parser: str | None = None
    grammar_compile_timeout_secs: float = 30.0
    grammar_compile_max_retries: int = 2
    disable_any_whitespace: bool = False
    # Slower synchronous grammar path, kept for checking the captured path gives the same output.
    disable_capturable_grammar: bool = False

    # Speculative decoding
    draft_model_path_use_base: bool | None = False
    speculative_config: str | None = None
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_draft_model_quantization: str | None = "unquant"
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None
    eagle3_layers_to_capture: str | list[int] | None = None
    # Prompt lookup (NGRAM, TokenSpeed's own flags, spelled as SGLang's): the longest suffix of the request's
    # tokens, from max down to min tokens, that occurred earlier proposes the tokens that followed it.
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12

    # On by default, as clients of vLLM expect (the seed's default is off): only the requests that ask
    # for logprobs have them computed (logprobs_wanted in the sampler); off, asking is a 400.
    enable_output_logprobs: bool = True

    # Runtime options
    disable_pdl: bool = False
    enable_prefix_caching: bool = True
    disable_kvstore: bool = False
    enforce_eager: bool = False
    disable_cuda_graph_padding: bool = False
    enable_cudagraph_gc: bool = False
    enable_nccl_nvls: bool = False
    enable_symm_mem: bool = False
    disable_custom_all_reduce: bool = False
    # None: by device. Overlap hides host work behind a device that runs ahead (CUDA); with --device cpu the
    # host does the device's work itself, so overlap would only hold each token back a step (off there).
    disable_overlap_schedule: bool | None = None
    disable_tf32: bool = False
    force_deterministic_rsag: bool = False
    disable_sampling_tp_sync: bool = False
    low_latency_max_num_tokens_per_gpu: int = 256
    max_cudagraph_capture_size: int | None = None
    disable_prefill_graph: bool | None = False
    # Largest prefill-graph token bucket: None means min(2048, chunked_prefill_size), 0 turns it off.
    prefill_graph_max_tokens: int | None = None
    # Explicit prefill buckets; unset uses a ladder with a bounded relative stride.
    prefill_graph_capture_sizes: list[int] | None = None
    cudagraph_capture_sizes: list[int] | None = None
    enable_nan_detection: bool = False
    enable_nvtx: bool = False
    enable_p2p_check: bool = False
    triton_attention_reduce_in_fp32: bool = False
    delete_ckpt_after_loading: bool = False
    weight_loader_prefetch_checkpoints: bool = False
    weight_loader_prefetch_num_threads: int = 4
    enable_memory_saver: bool = False
    enable_custom_logit_processor: bool = False
    mla_disable_ragged: bool = False
    warmups: str | None = None

    # Parallel layout (the resolved form is ``mapping``)
    nprocs_per_node: int | None = None
    world_size: int | None = None
    attn_tp_size: int | None = None
    dense_tp_size: int | None = None
    moe_tp_size: int | None = None
    mapping: Mapping | None = None
    mla_chunk_multiplier: int = 4
    mm_attention_backend: str | None = None

    # Disaggregated serving: "null", "prefill", "decode" or "encode" (vision tower only)
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_ib_device: str | None = None
    disaggregation_layerwise_interval: int = 1
    pdlb_url: str | None = None
    skip_server_warmup: bool = False

    # Fused communication + norm
    comm_fusion_max_num_tokens: int = 2048
    enable_allreduce_fusion: bool = False
    enable_expert_parallel: bool = False

    @property
    def mamba_cache_chunk_size(self) -> int:
        return max(FLA_CHUNK_SIZE, self.block_size)


def type_alternatives(hint: Any) -> list[Any]:
    """The types a field annotation allows, None left out: ``int | None`` gives ``[int]``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [kind for kind in typing.get_args(hint) if kind is not type(None)]
    return [hint]


def declared_choices() -> dict[str, tuple[Any, ...]]:
    """The choices of every field typed ``Literal[...]`` (or ``Literal[...] | None``), in their order."""
    hints = typing.get_type_hints(ServerFields)
    return {
        field.name: typing.get_args(kind)
        for field in dataclasses.fields(ServerFields)
        for kind in type_alternatives(hints[field.name])
        if typing.get_origin(kind) is Literal
    }
