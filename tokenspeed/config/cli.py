"""The ``tokenspeed serve`` command line: the parser, its flags (model, memory, caches, logging, parallel
layout) and the namespace -> ``ServerArgs`` mapping.

Kernel, speculative-decoding, runtime and disaggregation flags are in ``config.runtime_flags``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from collections.abc import Iterator
from typing import Any

from tokenspeed.config.api_key import resolve_api_key
from tokenspeed.config.flag_table import FlagRow, Opt, Switch, Toggle, add_groups
from tokenspeed.config.flags import FIELD_ALIASES, nullable_str
from tokenspeed.config.runtime_flags import (
    DISAGGREGATION_FLAGS,
    KERNEL_FLAGS,
    PARALLEL_SIZE_FLAGS,
    RUNTIME_OPTION_FLAGS,
    SPECULATIVE_FLAGS,
)
from tokenspeed.config.server_args import ServerArgs

# Namespace attributes that are spellings of a field rather than fields themselves.
CLI_ALIAS_DESTS = {
    **{dest: FIELD_ALIASES[dest] for dest in ("model_path", "tensor_parallel_size", "expert_parallel_size")},
    "api_key_file": "api_key",  # read by namespace_to_fields (config/api_key.py)
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    # Prefix matching would make adding a flag a breaking change for scripts using an abbreviation.
    parser.allow_abbrev = False
    add_groups(parser, _GROUPS)


def flag_rows() -> Iterator[FlagRow]:
    """Every row of the ``tokenspeed serve`` flags, in ``--help`` order (``config.argv`` spells fields
    back into flags with them)."""
    for _title, rows in _GROUPS:
        yield from rows


@dataclasses.dataclass(frozen=True)
class _ModelPositional:
    """``tokenspeed serve MODEL``: the model may be given without ``--model``."""

    def add(self, group: Any) -> None:
        group.add_argument(
            "model_path",
            nargs="?",
            metavar="model",
            default=None,
            help="Model to serve: a local directory or a Hugging Face repo id (same as --model).",
        )


_MODEL_FLAGS: tuple[FlagRow, ...] = (
    _ModelPositional(),
    Opt("--model", str, "Model directory or repo id.", aliases=("--model-path",), metavar="MODEL"),
    Opt("--tokenizer", str, "Tokenizer path; defaults to the model.", metavar="TOKENIZER"),
    Opt("--host", str, "Address the HTTP server binds (loopback unless you widen it)."),
    Opt("--port", int, "HTTP port."),
    Opt(
        "--tokenizer-mode",
        str,
        "'auto' prefers the fast tokenizer (plus model-specific hooks); 'slow' forces the Python one.",
    ),
    Toggle("--skip-tokenizer-init", "Do not load a tokenizer; requests must carry input_ids."),
    Switch(
        "--language-model-only",
        "Serve only the text model of a multimodal checkpoint; image/audio requests are refused.",
    ),
    Opt("--ext-yaml", str, "YAML describing an extensible model (with --load-format extensible)."),
    Opt(
        "--load-format",
        str,
        "Weight format: 'auto' tries safetensors then .bin; 'pt' .bin only; 'safetensors' only; "
        "'npcache' .bin cached as numpy; 'dummy' random weights (benchmarks, tests).",
    ),
    Toggle(
        "--trust-remote-code",
        "Run Python code shipped with the checkpoint (custom architectures). Off by default.",
    ),
    Opt(
        "--dtype",
        str,
        "Weight and activation dtype; 'auto' keeps BF16 checkpoints in BF16 and runs FP32/FP16 ones "
        "in FP16. 'half' = 'float16', 'float' = 'float32'.",
    ),
    Opt("--kv-cache-dtype", str, "KV cache dtype; 'auto' follows the model, 'fp8' = 'fp8_e4m3'."),
    Opt("--kv-cache-quant-method", str, "How KV cache values are scaled when quantized."),
    Opt("--quantization", str, "Weight quantization method of the checkpoint."),
    Opt(
        "--quantization-param-path",
        nullable_str,
        "JSON file of KV cache scales; without it FP8 KV scales are 1.0, which can cost accuracy.",
    ),
    Opt(
        "--max-model-len",
        int,
        "Longest context served; defaults to the model config's limit.",
        metavar="MAX_MODEL_LEN",
    ),
    Opt("--device", str, "Where the model runs; 'cpu' needs no GPU (torch kernels, no graphs)."),
    Opt("--served-model-name", str, "Model name reported by /v1/models; defaults to the model."),
    Opt("--revision", str, "Branch, tag or commit of the model repository."),
)


_MEMORY_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--gpu-memory-utilization",
        float,
        "Fraction of GPU memory for weights plus KV cache; default depends on the world size. "
        "Lower it after an out-of-memory error.",
        metavar="GPU_MEMORY_UTILIZATION",
    ),
    Opt("--max-num-seqs", int, "Most requests running at once.", metavar="MAX_NUM_SEQS"),
    Opt("--max-total-tokens", int, "KV pool size in tokens, instead of sizing it from free memory."),
    Opt(
        "--cpu-kv-cache-memory-gb",
        float,
        "With --device cpu and no --max-total-tokens: GiB of host memory for the KV pool.",
    ),
    Opt(
        "--chunked-prefill-size",
        int,
        "Token budget of one scheduler step (prefill chunks plus decodes); -1 turns chunking off.",
        metavar="CHUNKED_PREFILL_SIZE",
    ),
    Switch("--enable-mixed-batch", "Let prefill chunks and decodes share one step."),
    Opt("--block-size", int, "Tokens per KV cache page.", metavar="BLOCK_SIZE"),
    Opt(
        "--max-prefill-tokens",
        int,
        "Prefill token budget when chunked prefill is off; per-step budgets use --chunked-prefill-size.",
        metavar="MAX_PREFILL_TOKENS",
    ),
)


_CACHE_FLAGS: tuple[FlagRow, ...] = (
    Switch("--disable-kvstore", "Turn off the host-memory KVStore tier."),
    Opt("--kvstore-ratio", float, "KVStore host pool size as a multiple of the device pool."),
    Opt("--kvstore-size", int, "KVStore host pool size in GB; overrides --kvstore-ratio."),
    Opt("--kvstore-io-backend", str, "How KVStore pages move between host and device."),
    Opt("--kvstore-mem-layout", str, "Memory layout of the KVStore host pool."),
    Opt(
        "--kvstore-storage-backend",
        str,
        "Storage tier behind the KVStore (built in: mooncake). Custom backends are described with "
        "--kvstore-storage-backend-extra-config (backend_name, module_path, class_name).",
    ),
    Opt("--kvstore-storage-backend-extra-config", str, "JSON object of storage backend options."),
    Switch("--enable-mla-l1-5-cache", "Use the MLA L1.5 cache on disaggregated paths."),
    Opt("--mamba-ssm-dtype", str, "Dtype of Mamba SSM states."),
    Opt("--mamba-track-interval", int, "Decode steps between Mamba state snapshots."),
    Opt(
        "--max-mamba-cache-size", int, "Number of Mamba cache chunks; unset sizes the pool from free memory."
    ),
    Opt(
        "--mamba-full-memory-ratio",
        float,
        "Share of the cache budget given to Mamba state chunks versus full-attention KV.",
    ),
    Switch("--enable-mamba-l2", "Keep evicted Mamba states in a host-memory L2 cache."),
    Opt(
        "--mamba-l2-host-slots",
        int,
        "Host L2 slots; 0 derives them from --mamba-l2-host-gb or --mamba-l2-ratio.",
    ),
    Opt("--mamba-l2-ratio", float, "Host L2 slots as a multiple of device Mamba slots."),
    Opt("--mamba-l2-layout", str, "Memory layout of the Mamba host L2."),
    Opt("--mamba-l2-io-backend", str, "How Mamba states move between host and device."),
    Opt("--mamba-l2-host-gb", int, "Host memory (GiB) for the Mamba L2; beats --mamba-l2-ratio."),
)


_LOGGING_FLAGS: tuple[FlagRow, ...] = (
    Opt("--stream-interval", int, "Tokens per streamed chunk: higher is faster, lower smoother."),
    Switch("--stream-output", "Stream disjoint text segments instead of cumulative text."),
    Opt("--seed", int, "Random seed; drawn at random when unset.", metavar="SEED"),
    Opt(
        "--distributed-timeout-seconds",
        int,
        "Timeout of torch.distributed collectives and initialisation.",
        metavar="DISTRIBUTED_TIMEOUT_SECONDS",
    ),
    Opt("--download-dir", str, "Hugging Face download directory."),
    Opt("--base-gpu-id", int, "First GPU index this server uses (several servers on one host)."),
    Opt("--gpu-id-step", int, "Step between GPU indices: 2 uses GPUs 0, 2, 4, ..."),
    Opt("--log-level", str, "Log level of every logger."),
    Opt("--log-level-http", str, "Log level of the HTTP server; defaults to --log-level."),
    Toggle("--enable-log-requests", "Log each request; detail set by --log-requests-level."),
    Opt("--log-requests-level", int, "0: metadata; 1: metadata and truncated input/output; 2: everything."),
    Toggle(
        "--enable-log-request-stats",
        "Log one summary line per finished or aborted request (timings, token counts, cache hits, "
        "decode speed, speculative acceptance); measured on the host, no GPU sync.",
    ),
    Switch("--enable-metrics", "Export Prometheus metrics at /metrics."),
    Opt(
        "--metrics-reporters",
        None,
        "Metrics reporter (repeatable); defaults to prometheus.",
        action="append",
        default=None,
    ),
    Opt("--app-key", str, "Application key attached to metrics."),
    Opt("--decode-log-interval", int, "Decode steps between batch log lines."),
    Opt(
        "--api-key",
        str,
        "Bearer key required by every HTTP route but /health. Visible to local users in the process "
        "list: prefer --api-key-file or $TOKENSPEED_API_KEY, which also set it.",
    ),
    Opt(
        "--api-key-file",
        str,
        "File holding the API key (mode 600: refused if group or others can read it). A TokenSpeed flag, "
        "not in the upstream set.",
        metavar="PATH",
    ),
    Opt(
        "--max-request-bytes",
        int,
        "Largest HTTP request body accepted, in bytes (default 4 MiB); a larger one is answered 413 before "
        "it is read. A TokenSpeed flag, not in the upstream set.",
    ),
    Opt(
        "--max-sequences-per-request",
        int,
        "Most sequences (prompts x n) one request may ask for (default 1024); a larger request is answered "
        "400 naming the field, before any prompt is tokenized. A TokenSpeed flag, not in the upstream set.",
    ),
    Opt(
        "--max-queued-requests",
        int,
        "Most sequences the server holds at once, waiting or running (default 4096); a request past it is "
        "answered 503 with Retry-After. A TokenSpeed flag, not in the upstream set.",
    ),
    Opt(
        "--max-queued-tokens",
        int,
        "Most prompt tokens the server holds at once (default 8x the KV cache); a request past it is "
        "answered 503 with Retry-After. A TokenSpeed flag, not in the upstream set.",
    ),
    Switch("--enable-cache-report", "Report cached prompt tokens in usage.prompt_tokens_details."),
    Opt(
        "--kv-events-config",
        str,
        "JSON config of the KV cache event publisher, e.g. enable_kv_cache_events with a zmq publisher.",
    ),
)


_PARALLEL_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--data-parallel-size",
        int,
        "Attention data-parallel replicas; inferred from --world-size and --tp when unset.",
        metavar="DATA_PARALLEL_SIZE",
    ),
    Opt("--load-balance-method", str, "How requests are spread over data-parallel replicas."),
    Opt("--load-watch-interval", float, "Seconds between replica load samples."),
    Opt(
        "--expert-parallel-size",
        int,
        "Expert-parallel size of MoE layers (default 1).",
        aliases=("--ep-size",),
        default=None,
    ),
    Opt("--init-expert-location", str, "Initial placement of experts on EP ranks."),
    Opt("--ep-num-redundant-experts", int, "Extra expert replicas to place for load balance."),
    Opt("--ep-dispatch-algorithm", str, "How tokens pick among replicas of an expert."),
    Opt("--eplb-algorithm", str, "Expert placement (EPLB) algorithm."),
    Opt("--expert-distribution-recorder-mode", str, "What the expert-load recorder counts."),
    Opt(
        "--expert-distribution-recorder-buffer-size",
        int,
        "Passes kept by the expert-load recorder; -1 keeps all.",
    ),
    Switch("--enable-expert-distribution-metrics", "Export expert-load balance metrics."),
    Switch("--enable-eplb", "Rebalance expert placement from recorded load while serving."),
    Opt(
        "--eplb-rebalance-num-iterations",
        int,
        "Forward passes between two live expert rebalances (--enable-eplb).",
    ),
    Opt("--moe-backend", str, "MoE kernel backend: auto, triton, gluon, flashinfer_trtllm."),
    Opt("--draft-moe-backend", str, "MoE backend of the draft model; defaults to --moe-backend."),
    Opt(
        "--dense-gemv-backend",
        str,
        "bf16/fp16 linear layers and the LM head at decode batches of 1-4 rows: 'triton' (a Triton GEMV, "
        "autotuned per shape), 'torch' (F.linear, cuBLAS), 'auto' (torch until the GEMV is measured on the H200; default). A TokenSpeed "
        "flag, not in the upstream set.",
    ),
    Opt("--all2all-backend", str, "MoE all-to-all: none, deepep, ...", metavar="ALL2ALL_BACKEND"),
    Opt(
        "--deepep-mode",
        str,
        "DeepEP mode; 'auto' uses low_latency for decode batches and normal for prefill.",
    ),
    Switch("--disable-flashinfer-cutlass-moe-fp4-allgather", "Skip the FP4 allgather of cutlass MoE."),
    Opt("--dist-init-addr", str, "host:port of the head node for distributed init."),
    Opt("--nnodes", int, "Number of nodes."),
    Opt("--node-rank", int, "Rank of this node (0 is the head)."),
    Opt("--hf-overrides", str, "JSON object merged into the model config.", metavar="HF_OVERRIDES"),
    Opt("--preferred-sampling-params", str, "JSON sampling defaults shown by /get_model_info."),
)


# Every argument group, in ``--help`` order.
_GROUPS: tuple[tuple[str, tuple[FlagRow, ...]], ...] = (
    ("model and tokenizer", _MODEL_FLAGS),
    ("memory and scheduling", _MEMORY_FLAGS),
    ("kvstore and mamba caches", _CACHE_FLAGS),
    ("logging, metrics and API", _LOGGING_FLAGS),
    ("parallelism and multi-node", _PARALLEL_FLAGS),
    ("kernel backends and structured output", KERNEL_FLAGS),
    ("speculative decoding", SPECULATIVE_FLAGS),
    ("runtime options", RUNTIME_OPTION_FLAGS),
    ("parallel sizes", PARALLEL_SIZE_FLAGS),
    ("disaggregated serving", DISAGGREGATION_FLAGS),
)


def namespace_to_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Turn a parsed namespace into ``ServerArgs`` keyword arguments, folding flag aliases."""
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
    if "api_key" in values:
        values["api_key"] = resolve_api_key(values["api_key"], values.pop("api_key_file", None), os.environ)
    if "metrics_reporters" in values:
        # Repeated flags can name a reporter twice; keep the first of each.
        values["metrics_reporters"] = list(dict.fromkeys(values["metrics_reporters"] or ["prometheus"]))
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    # Only pass what the parser produced, so fields without a flag keep their dataclass default.
    return {name: value for name, value in values.items() if name in names}


def from_namespace(args: argparse.Namespace, platform: Any = None) -> ServerArgs:
    """Build (and resolve) a ``ServerArgs`` from a namespace parsed by ``build_parser()``."""
    return ServerArgs(**namespace_to_fields(args), platform=platform)


class _ServeArgumentParser(argparse.ArgumentParser):
    """argparse, plus a "did you mean" for a mistyped flag (there are more than 150 of them)."""

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            known = [opt for action in self._actions for opt in action.option_strings]
            hints = []
            for word in message.split(":", 1)[1].split():
                if word.startswith("--"):
                    flag = word.split("=", 1)[0]
                    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
                    if close:
                        hints.append(f"{flag}: did you mean {close[0]}?")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """A parser with every ``tokenspeed serve`` flag."""
    parser = _ServeArgumentParser(prog=prog, allow_abbrev=False)
    add_cli_args(parser)
    return parser


def prepare_server_args(argv: list[str], platform: Any = None) -> ServerArgs:
    """Parse ``argv`` (typically ``sys.argv[2:]`` after ``serve``) into a resolved ``ServerArgs``."""
    return from_namespace(build_parser().parse_args(argv), platform=platform)
