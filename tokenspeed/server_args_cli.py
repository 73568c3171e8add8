"""The ``tokenspeed serve`` flags (model, memory, caches, logging, parallel layout) and namespace mapping.

Kernel, speculative-decoding, runtime and disaggregation flags are in ``server_args_cli_runtime``.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tokenspeed.server_args_cli_runtime import add_runtime_args
from tokenspeed.server_args_flags import nullable_str, option, switch, toggle

# Namespace attributes that are spellings of a field rather than fields themselves.
CLI_ALIAS_DESTS = {
    "model_path": "model",
    "tensor_parallel_size": "attn_tp_size",
    "expert_parallel_size": "ep_size",
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    # Prefix matching would make adding a flag a breaking change for scripts using an abbreviation.
    parser.allow_abbrev = False
    _add_model_args(parser.add_argument_group("model and tokenizer"))
    _add_memory_args(parser.add_argument_group("memory and scheduling"))
    _add_cache_args(parser.add_argument_group("kvstore and mamba caches"))
    _add_logging_args(parser.add_argument_group("logging, metrics and API"))
    _add_parallel_args(parser.add_argument_group("parallelism and multi-node"))
    add_runtime_args(parser)


def _add_model_args(g: Any) -> None:
    g.add_argument(
        "model_path",
        nargs="?",
        metavar="model",
        default=None,
        help="Model to serve: a local directory or a Hugging Face repo id (same as --model).",
    )
    option(g, "--model", "--model-path", metavar="MODEL", type=str, help="Model directory or repo id.")
    option(g, "--tokenizer", metavar="TOKENIZER", type=str, help="Tokenizer path; defaults to the model.")
    option(g, "--host", type=str, help="Address the HTTP server binds (loopback unless you widen it).")
    option(g, "--port", type=int, help="HTTP port.")
    option(
        g,
        "--tokenizer-mode",
        type=str,
        help="'auto' prefers the fast tokenizer (plus model-specific hooks); 'slow' forces the Python one.",
    )
    toggle(g, "--skip-tokenizer-init", help="Do not load a tokenizer; requests must carry input_ids.")
    switch(
        g,
        "--language-model-only",
        help="Serve only the text model of a multimodal checkpoint; image/audio requests are refused.",
    )
    option(
        g, "--ext-yaml", type=str, help="YAML describing an extensible model (with --load-format extensible)."
    )
    option(
        g,
        "--load-format",
        type=str,
        help="Weight format: 'auto' tries safetensors then .bin; 'pt' .bin only; 'safetensors' only; "
        "'npcache' .bin cached as numpy; 'dummy' random weights (benchmarks, tests).",
    )
    toggle(
        g,
        "--trust-remote-code",
        help="Run Python code shipped with the checkpoint (custom architectures). Off by default.",
    )
    option(
        g,
        "--dtype",
        type=str,
        help="Weight and activation dtype; 'auto' keeps BF16 checkpoints in BF16 and runs FP32/FP16 ones "
        "in FP16. 'half' = 'float16', 'float' = 'float32'.",
    )
    option(
        g, "--kv-cache-dtype", type=str, help="KV cache dtype; 'auto' follows the model, 'fp8' = 'fp8_e4m3'."
    )
    option(g, "--kv-cache-quant-method", type=str, help="How KV cache values are scaled when quantized.")
    option(g, "--quantization", type=str, help="Weight quantization method of the checkpoint.")
    option(
        g,
        "--quantization-param-path",
        type=nullable_str,
        help="JSON file of KV cache scales; without it FP8 KV scales are 1.0, which can cost accuracy.",
    )
    option(
        g,
        "--max-model-len",
        metavar="MAX_MODEL_LEN",
        type=int,
        help="Longest context served; defaults to the model config's limit.",
    )
    option(
        g, "--device", type=str, help="Where the model runs; 'cpu' needs no GPU (torch kernels, no graphs)."
    )
    option(
        g, "--served-model-name", type=str, help="Model name reported by /v1/models; defaults to the model."
    )
    option(g, "--revision", type=str, help="Branch, tag or commit of the model repository.")


def _add_memory_args(g: Any) -> None:
    option(
        g,
        "--gpu-memory-utilization",
        metavar="GPU_MEMORY_UTILIZATION",
        type=float,
        help="Fraction of GPU memory for weights plus KV cache; default depends on the world size. "
        "Lower it after an out-of-memory error.",
    )
    option(g, "--max-num-seqs", metavar="MAX_NUM_SEQS", type=int, help="Most requests running at once.")
    option(
        g,
        "--max-total-tokens",
        type=int,
        help="KV pool size in tokens, instead of sizing it from free memory.",
    )
    option(
        g,
        "--cpu-kv-cache-memory-gb",
        type=float,
        help="With --device cpu and no --max-total-tokens: GiB of host memory for the KV pool.",
    )
    option(
        g,
        "--chunked-prefill-size",
        metavar="CHUNKED_PREFILL_SIZE",
        type=int,
        help="Token budget of one scheduler step (prefill chunks plus decodes); -1 turns chunking off.",
    )
    switch(g, "--enable-mixed-batch", help="Let prefill chunks and decodes share one step.")
    option(g, "--block-size", metavar="BLOCK_SIZE", type=int, help="Tokens per KV cache page.")
    option(
        g,
        "--max-prefill-tokens",
        metavar="MAX_PREFILL_TOKENS",
        type=int,
        help="Prefill token budget when chunked prefill is off; per-step budgets use --chunked-prefill-size.",
    )


def _add_cache_args(g: Any) -> None:
    switch(g, "--disable-kvstore", help="Turn off the host-memory KVStore tier.")
    option(g, "--kvstore-ratio", type=float, help="KVStore host pool size as a multiple of the device pool.")
    option(g, "--kvstore-size", type=int, help="KVStore host pool size in GB; overrides --kvstore-ratio.")
    option(g, "--kvstore-io-backend", type=str, help="How KVStore pages move between host and device.")
    option(g, "--kvstore-mem-layout", type=str, help="Memory layout of the KVStore host pool.")
    option(
        g,
        "--kvstore-storage-backend",
        type=str,
        help="Storage tier behind the KVStore (built in: mooncake). Custom backends are described with "
        "--kvstore-storage-backend-extra-config (backend_name, module_path, class_name).",
    )
    option(
        g, "--kvstore-storage-backend-extra-config", type=str, help="JSON object of storage backend options."
    )
    switch(g, "--enable-mla-l1-5-cache", help="Use the MLA L1.5 cache on disaggregated paths.")
    option(g, "--mamba-ssm-dtype", type=str, help="Dtype of Mamba SSM states.")
    option(g, "--mamba-track-interval", type=int, help="Decode steps between Mamba state snapshots.")
    option(
        g,
        "--max-mamba-cache-size",
        type=int,
        help="Number of Mamba cache chunks; unset sizes the pool from free memory.",
    )
    option(
        g,
        "--mamba-full-memory-ratio",
        type=float,
        help="Share of the cache budget given to Mamba state chunks versus full-attention KV.",
    )
    switch(g, "--enable-mamba-l2", help="Keep evicted Mamba states in a host-memory L2 cache.")
    option(
        g,
        "--mamba-l2-host-slots",
        type=int,
        help="Host L2 slots; 0 derives them from --mamba-l2-host-gb or --mamba-l2-ratio.",
    )
    option(g, "--mamba-l2-ratio", type=float, help="Host L2 slots as a multiple of device Mamba slots.")
    option(g, "--mamba-l2-layout", type=str, help="Memory layout of the Mamba host L2.")
    option(g, "--mamba-l2-io-backend", type=str, help="How Mamba states move between host and device.")
    option(
        g, "--mamba-l2-host-gb", type=int, help="Host memory (GiB) for the Mamba L2; beats --mamba-l2-ratio."
    )


def _add_logging_args(g: Any) -> None:
    option(
        g, "--stream-interval", type=int, help="Tokens per streamed chunk: higher is faster, lower smoother."
    )
    switch(g, "--stream-output", help="Stream disjoint text segments instead of cumulative text.")
    option(g, "--seed", metavar="SEED", type=int, help="Random seed; drawn at random when unset.")
    option(
        g,
        "--distributed-timeout-seconds",
        metavar="DISTRIBUTED_TIMEOUT_SECONDS",
        type=int,
        help="Timeout of torch.distributed collectives and initialisation.",
    )
    option(g, "--download-dir", type=str, help="Hugging Face download directory.")
    option(
        g, "--base-gpu-id", type=int, help="First GPU index this server uses (several servers on one host)."
    )
    option(g, "--gpu-id-step", type=int, help="Step between GPU indices: 2 uses GPUs 0, 2, 4, ...")
    option(g, "--log-level", type=str, help="Log level of every logger.")
    option(g, "--log-level-http", type=str, help="Log level of the HTTP server; defaults to --log-level.")
    toggle(g, "--enable-log-requests", help="Log each request; detail set by --log-requests-level.")
    option(
        g,
        "--log-requests-level",
        type=int,
        help="0: metadata; 1: metadata and truncated input/output; 2: everything.",
    )
    toggle(
        g,
        "--enable-log-request-stats",
        help="Log one summary line per finished or aborted request (timings, token counts, cache hits, "
        "decode speed, speculative acceptance); measured on the host, no GPU sync.",
    )
    switch(g, "--enable-metrics", help="Export Prometheus metrics at /metrics.")
    option(
        g,
        "--metrics-reporters",
        action="append",
        default=None,
        help="Metrics reporter (repeatable); defaults to prometheus.",
    )
    option(g, "--app-key", type=str, help="Application key attached to metrics.")
    option(g, "--decode-log-interval", type=int, help="Decode steps between batch log lines.")
    option(
        g, "--api-key", type=str, help="Bearer key required by the HTTP API (OpenAI-compatible routes too)."
    )
    switch(g, "--enable-cache-report", help="Report cached prompt tokens in usage.prompt_tokens_details.")
    option(
        g,
        "--kv-events-config",
        type=str,
        help="JSON config of the KV cache event publisher, e.g. enable_kv_cache_events with a zmq publisher.",
    )


def _add_parallel_args(g: Any) -> None:
    option(
        g,
        "--data-parallel-size",
        metavar="DATA_PARALLEL_SIZE",
        type=int,
        help="Attention data-parallel replicas; inferred from --world-size and --tp when unset.",
    )
    option(g, "--load-balance-method", type=str, help="How requests are spread over data-parallel replicas.")
    option(g, "--load-watch-interval", type=float, help="Seconds between replica load samples.")
    option(
        g,
        "--expert-parallel-size",
        "--ep-size",
        type=int,
        default=None,
        help="Expert-parallel size of MoE layers (default 1).",
    )
    option(g, "--init-expert-location", type=str, help="Initial placement of experts on EP ranks.")
    option(g, "--ep-num-redundant-experts", type=int, help="Extra expert replicas to place for load balance.")
    option(g, "--ep-dispatch-algorithm", type=str, help="How tokens pick among replicas of an expert.")
    option(g, "--eplb-algorithm", type=str, help="Expert placement (EPLB) algorithm.")
    option(g, "--expert-distribution-recorder-mode", type=str, help="What the expert-load recorder counts.")
    option(
        g,
        "--expert-distribution-recorder-buffer-size",
        type=int,
        help="Passes kept by the expert-load recorder; -1 keeps all.",
    )
    switch(g, "--enable-expert-distribution-metrics", help="Export expert-load balance metrics.")
    switch(g, "--enable-eplb", help="Rebalance expert placement from recorded load while serving.")
    option(
        g,
        "--eplb-rebalance-num-iterations",
        type=int,
        help="Forward passes between two live expert rebalances (--enable-eplb).",
    )
    option(g, "--moe-backend", type=str, help="MoE kernel backend: auto, triton, gluon, flashinfer_trtllm.")
    option(
        g, "--draft-moe-backend", type=str, help="MoE backend of the draft model; defaults to --moe-backend."
    )
    option(
        g, "--all2all-backend", metavar="ALL2ALL_BACKEND", type=str, help="MoE all-to-all: none, deepep, ..."
    )
    option(
        g,
        "--deepep-mode",
        type=str,
        help="DeepEP mode; 'auto' uses low_latency for decode batches and normal for prefill.",
    )
    switch(g, "--disable-flashinfer-cutlass-moe-fp4-allgather", help="Skip the FP4 allgather of cutlass MoE.")
    option(g, "--dist-init-addr", type=str, help="host:port of the head node for distributed init.")
    option(g, "--nnodes", type=int, help="Number of nodes.")
    option(g, "--node-rank", type=int, help="Rank of this node (0 is the head).")
    option(
        g,
        "--hf-overrides",
        metavar="HF_OVERRIDES",
        type=str,
        help="JSON object merged into the model config.",
    )
    option(
        g, "--preferred-sampling-params", type=str, help="JSON sampling defaults shown by /get_model_info."
    )


def namespace_to_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Turn a parsed namespace into ``ServerArgs`` keyword arguments, folding flag aliases."""
    from tokenspeed.server_args import ServerArgs

    values = dict(vars(args))
    positional = values.pop("model_path", None)
    if positional is not None and values.get("model") is not None:
        raise ValueError("the model is given twice (positional and --model); keep one of them")
    if positional is not None:
        values["model"] = positional
    if values.get("model") is None:
        raise ValueError("a model is required: `tokenspeed serve MODEL` or --model MODEL")
    tp = values.pop("tensor_parallel_size", None)
    if tp is not None:
        if values.get("attn_tp_size") is not None:
            raise ValueError(
                "--tp/--tensor-parallel-size and --attn-tp-size set the same size; pass only one"
            )
        values["attn_tp_size"] = tp
    ep = values.pop("expert_parallel_size", None)
    values["ep_size"] = 1 if ep is None else ep
    if "metrics_reporters" in values:
        # Repeated flags can name a reporter twice; keep the first of each.
        values["metrics_reporters"] = list(dict.fromkeys(values["metrics_reporters"] or ["prometheus"]))
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    # Only pass what the parser produced, so fields without a flag keep their dataclass default.
    return {name: value for name, value in values.items() if name in names}
