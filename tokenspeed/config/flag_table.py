"""The ``tokenspeed serve`` flag table: every flag, one row each, in argument groups.

Each fact about a flag is stated here once: its spellings (aliases included) and help, and a value type,
default or metavar only where it is not the ``ServerArgs`` field's own (the field's annotation gives the
type, the field its default, ``config.flags`` the choices). A row's place in its group is its place in
``--help``. From this table come the parser and a field's command line (``config.cli``; the console starts
profile servers with ``to_argv``), the flag a message or ``--print-config`` names
(``config.support_check.flag_of``) and the flag spellings a profile accepts as keys
(``console.profile.server``).
"""

from __future__ import annotations

from collections.abc import Iterator

from tokenspeed.config.flag_rows import FlagRow, Opt, OptionalBool, Positional, Switch, SwitchPair, Toggle
from tokenspeed.config.flags import nullable_str

MODEL_FLAGS: tuple[FlagRow, ...] = (
    Positional(
        "model_path", "model", "Model to serve: a local directory or a Hugging Face repo id (same as --model)."
    ),
    Opt("--model", "Model directory or repo id.", aliases=("--model-path",)),
    Opt("--tokenizer", "Tokenizer path; defaults to the model."),
    Opt("--host", "Address the HTTP server binds (loopback unless you widen it)."),
    Opt("--port", "HTTP port."),
    Opt(
        "--tokenizer-mode",
        "'auto' prefers the fast tokenizer (plus model-specific hooks); 'slow' forces the Python one.",
    ),
    Toggle("--skip-tokenizer-init", "Do not load a tokenizer; requests must carry input_ids."),
    Switch(
        "--language-model-only",
        "Serve only the text model of a multimodal checkpoint; image/audio requests are refused.",
    ),
    Opt("--ext-yaml", "YAML describing an extensible model (with --load-format extensible)."),
    Opt(
        "--load-format",
        "Weight format: 'auto' tries safetensors then .bin; 'pt' .bin only; 'safetensors' only; "
        "'npcache' .bin cached as numpy; 'dummy' random weights (benchmarks, tests).",
    ),
    Toggle(
        "--trust-remote-code",
        "Run Python code shipped with the checkpoint (custom architectures). Off by default.",
    ),
    Opt(
        "--dtype",
        "Weight and activation dtype; 'auto' keeps BF16 checkpoints in BF16 and runs FP32/FP16 ones "
        "in FP16. 'half' = 'float16', 'float' = 'float32'.",
    ),
    Opt("--kv-cache-dtype", "KV cache dtype; 'auto' follows the model, 'fp8' = 'fp8_e4m3'."),
    Opt("--kv-cache-quant-method", "How KV cache values are scaled when quantized."),
    Opt("--quantization", "Weight quantization method of the checkpoint."),
    Opt(
        "--quantization-param-path",
        "JSON file of KV cache scales; without it FP8 KV scales are 1.0, which can cost accuracy.",
        type=nullable_str,
    ),
    Opt("--max-model-len", "Longest context served; defaults to the model config's limit."),
    Opt("--device", "Where the model runs; 'cpu' needs no GPU (torch kernels, no graphs)."),
    Opt("--served-model-name", "Model name reported by /v1/models; defaults to the model."),
    Opt("--revision", "Branch, tag or commit of the model repository."),
)


MEMORY_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--gpu-memory-utilization",
        "Fraction of GPU memory for weights plus KV cache; default depends on the world size. "
        "Lower it after an out-of-memory error.",
    ),
    Opt("--max-num-seqs", "Most requests running at once."),
    Opt("--max-total-tokens", "KV pool size in tokens, instead of sizing it from free memory."),
    Opt(
        "--cpu-kv-cache-memory-gb",
        "With --device cpu and no --max-total-tokens: GiB of host memory for the KV pool.",
    ),
    Opt(
        "--chunked-prefill-size",
        "Token budget of one scheduler step (prefill chunks plus decodes); -1 turns chunking off.",
    ),
    Switch("--enable-mixed-batch", "Let prefill chunks and decodes share one step."),
    Opt("--block-size", "Tokens per KV cache page."),
    Opt(
        "--max-prefill-tokens",
        "Prefill token budget when chunked prefill is off; per-step budgets use --chunked-prefill-size.",
    ),
)


CACHE_FLAGS: tuple[FlagRow, ...] = (
    Switch("--disable-kvstore", "Turn off the host-memory KVStore tier."),
    Opt("--kvstore-ratio", "KVStore host pool size as a multiple of the device pool."),
    Opt("--kvstore-size", "KVStore host pool size in GB; overrides --kvstore-ratio."),
    Opt("--kvstore-io-backend", "How KVStore pages move between host and device."),
    Opt("--kvstore-mem-layout", "Memory layout of the KVStore host pool."),
    Opt(
        "--kvstore-storage-backend",
        "Storage tier behind the KVStore (built in: mooncake). Custom backends are described with "
        "--kvstore-storage-backend-extra-config (backend_name, module_path, class_name).",
    ),
    Opt("--kvstore-storage-backend-extra-config", "JSON object of storage backend options."),
    Switch("--enable-mla-l1-5-cache", "Use the MLA L1.5 cache on disaggregated paths."),
    Opt("--mamba-ssm-dtype", "Dtype of Mamba SSM states."),
    Opt("--mamba-track-interval", "Decode steps between Mamba state snapshots."),
    Opt("--max-mamba-cache-size", "Number of Mamba cache chunks; unset sizes the pool from free memory."),
    Opt(
        "--mamba-full-memory-ratio",
        "Share of the cache budget given to Mamba state chunks versus full-attention KV.",
    ),
    Switch("--enable-mamba-l2", "Keep evicted Mamba states in a host-memory L2 cache."),
    Opt(
        "--mamba-l2-host-slots", "Host L2 slots; 0 derives them from --mamba-l2-host-gb or --mamba-l2-ratio."
    ),
    Opt("--mamba-l2-ratio", "Host L2 slots as a multiple of device Mamba slots."),
    Opt("--mamba-l2-layout", "Memory layout of the Mamba host L2."),
    Opt("--mamba-l2-io-backend", "How Mamba states move between host and device."),
    Opt("--mamba-l2-host-gb", "Host memory (GiB) for the Mamba L2; beats --mamba-l2-ratio."),
)


LOGGING_FLAGS: tuple[FlagRow, ...] = (
    Opt("--stream-interval", "Tokens per streamed chunk: higher is faster, lower smoother."),
    Switch("--stream-output", "Stream disjoint text segments instead of cumulative text."),
    Opt("--seed", "Random seed for sampling; drawn at random when unset (--load-format dummy weights do not follow it)."),
    Opt("--distributed-timeout-seconds", "Timeout of torch.distributed collectives and initialisation."),
    Opt("--download-dir", "Hugging Face download directory."),
    Opt("--base-gpu-id", "First GPU index this server uses (several servers on one host)."),
    Opt("--gpu-id-step", "Step between GPU indices: 2 uses GPUs 0, 2, 4, ..."),
    Opt("--log-level", "Log level of every logger."),
    Opt("--log-level-http", "Log level of the HTTP server; defaults to --log-level."),
    Toggle("--enable-log-requests", "Log each request; detail set by --log-requests-level."),
    Opt("--log-requests-level", "0: metadata; 1: metadata and truncated input/output; 2: everything."),
    Toggle(
        "--enable-log-request-stats",
        "Log one summary line per finished or aborted request (timings, token counts, cache hits, "
        "decode speed, speculative acceptance); measured on the host, no GPU sync.",
    ),
    Switch("--enable-metrics", "Export Prometheus metrics at /metrics."),
    Opt(
        "--metrics-reporters",
        "Metrics reporter (repeatable); defaults to prometheus.",
        type=None,
        action="append",
    ),
    Opt("--app-key", "Application key attached to metrics."),
    Opt("--decode-log-interval", "Decode steps between batch log lines."),
    Opt(
        "--api-key",
        "Bearer key required by every HTTP route but /health. Visible to local users in the process "
        "list: prefer --api-key-file or $TOKENSPEED_API_KEY, which also set it.",
    ),
    Opt(
        "--api-key-file",
        "File holding the API key (mode 600: refused if group or others can read it). A TokenSpeed flag, "
        "not in the upstream set.",
        type=str,  # not a field: its file gives api_key
        metavar="PATH",
    ),
    Opt(
        "--max-request-bytes",
        "Largest HTTP request body accepted, in bytes (default 4 MiB); a larger one is answered 413 before "
        "it is read. A TokenSpeed flag, not in the upstream set.",
    ),
    Opt(
        "--max-sequences-per-request",
        "Most sequences (prompts x n) one request may ask for (default 1024); a larger request is answered "
        "400 naming the field, before any prompt is tokenized. A TokenSpeed flag, not in the upstream set.",
    ),
    Opt(
        "--max-queued-requests",
        "Most sequences the server holds at once, waiting or running (default 4096); a request past it is "
        "answered 503 with Retry-After. A TokenSpeed flag, not in the upstream set.",
    ),
    Opt(
        "--max-queued-tokens",
        "Most prompt tokens the server holds at once (default 8x the KV cache); a request past it is "
        "answered 503 with Retry-After. A TokenSpeed flag, not in the upstream set.",
    ),
    Switch("--enable-cache-report", "Report cached prompt tokens in usage.prompt_tokens_details."),
    Opt(
        "--kv-events-config",
        "JSON config of the KV cache event publisher, e.g. enable_kv_cache_events with a zmq publisher.",
    ),
)


PARALLEL_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--data-parallel-size",
        "Attention data-parallel replicas; inferred from --world-size and --tp when unset.",
    ),
    Opt("--load-balance-method", "How requests are spread over data-parallel replicas."),
    Opt("--load-watch-interval", "Seconds between replica load samples."),
    Opt("--expert-parallel-size", "Expert-parallel size of MoE layers (default 1).", aliases=("--ep-size",)),
    Opt("--init-expert-location", "Initial placement of experts on EP ranks."),
    Opt("--ep-num-redundant-experts", "Extra expert replicas to place for load balance."),
    Opt("--ep-dispatch-algorithm", "How tokens pick among replicas of an expert."),
    Opt("--eplb-algorithm", "Expert placement (EPLB) algorithm."),
    Opt("--expert-distribution-recorder-mode", "What the expert-load recorder counts."),
    Opt(
        "--expert-distribution-recorder-buffer-size", "Passes kept by the expert-load recorder; -1 keeps all."
    ),
    Switch("--enable-expert-distribution-metrics", "Export expert-load balance metrics."),
    Switch("--enable-eplb", "Rebalance expert placement from recorded load while serving."),
    Opt(
        "--eplb-rebalance-num-iterations",
        "Forward passes between two live expert rebalances (--enable-eplb).",
    ),
    Opt("--moe-backend", "MoE kernel backend: auto, triton, gluon, flashinfer_trtllm."),
    Opt("--draft-moe-backend", "MoE backend of the draft model; defaults to --moe-backend."),
    Opt(
        "--dense-gemv-backend",
        "bf16/fp16 linear layers and the LM head at decode batches of 1-4 rows: 'triton' (a Triton GEMV, "
        "autotuned per shape), 'torch' (F.linear, cuBLAS), 'auto' (the GEMV for the shapes and batches the GPU's "
        "tuned table names, cuBLAS elsewhere; default). A TokenSpeed flag, not in the upstream set.",
    ),
    Opt("--all2all-backend", "MoE all-to-all: none, deepep, ..."),
    Opt("--deepep-mode", "DeepEP mode; 'auto' uses low_latency for decode batches and normal for prefill."),
    Switch("--disable-flashinfer-cutlass-moe-fp4-allgather", "Skip the FP4 allgather of cutlass MoE."),
    Opt("--dist-init-addr", "host:port of the head node for distributed init."),
    Opt("--nnodes", "Number of nodes."),
    Opt("--node-rank", "Rank of this node (0 is the head)."),
    Opt("--hf-overrides", "JSON object merged into the model config."),
    Opt("--preferred-sampling-params", "JSON sampling defaults shown by /get_model_info."),
)


KERNEL_FLAGS: tuple[FlagRow, ...] = (
    Opt("--attention-backend", "Attention kernels; chosen from hardware and model when unset."),
    Opt(
        "--drafter-attention-backend",
        "Attention kernels of the draft model; defaults to --attention-backend.",
    ),
    Opt(
        "--sampling-backend",
        "Sampler. 'greedy' is argmax only (ignores temperature/top-p/top-k); 'flashinfer' and 'triton' "
        "honour temperature/top-k/top-p; the '_full' variants add min-p, penalties and logit bias at the "
        "cost of a per-request token-count buffer; 'torch' is the portable sampler used on the CPU. "
        "Default: flashinfer on NVIDIA, torch on the CPU, greedy elsewhere.",
    ),
    Switch("--dp-sampling", "Split speculative verification sampling over the batch (Batch-DP)."),
    Opt("--dp-sampling-min-bs", "Smallest batch that uses --dp-sampling (default 2 x TP)."),
    OptionalBool(
        "--attention-use-fp4-indexer-cache",
        "Store the sparse-attention indexer cache as MXFP4.",
        aliases=("--attention-config.use-fp4-indexer-cache", "--attention_config.use_fp4_indexer_cache"),
    ),
    OptionalBool(
        "--attention-config.use-trtllm-ragged-deepseek-prefill",
        "Use the ragged prefill kernel for DeepSeek MLA (false is the same as --mla-disable-ragged).",
        aliases=(
            "--attention-config.use_trtllm_ragged_deepseek_prefill",
            "--attention_config.use_trtllm_ragged_deepseek_prefill",
        ),
        dest="use_trtllm_ragged_deepseek_prefill",
    ),
    Opt(
        "--deepseek-v4-mega-moe-max-num-tokens",
        "Token cap of the DeepSeek V4 MegaMoE staging buffer (0: derive from prefill/graph budgets).",
    ),
    Opt(
        "--deepseek-v4-indexer-prefill-max-logits-mb",
        "MiB cap of the DeepSeek V4 sparse-indexer prefill logits workspace.",
    ),
    Opt("--deepseek-v4-prefill-chunk-size", "Requests per DeepSeek V4 prefill chunk."),
    Opt(
        "--grammar-backend",
        "Structured output (response_format, guided_*, structured_outputs, tool_choice required or named): "
        "xgrammar (default) or llguidance; 'none' turns it off and such requests get a 400.",
    ),
    Opt(
        "--reasoning-parser",
        "Moves the model's <think>...</think> section to reasoning_content, and starts JSON-schema "
        "grammars after it: qwen3 (the output opens <think>) or deepseek-r1 (the prompt opened it).",
    ),
    Opt(
        "--tool-call-parser",
        "How tool calls are read from the model's text for tool_choice auto: hermes (Qwen's <tool_call> "
        "JSON) or llama3_json. A TokenSpeed flag, spelled as vLLM and SGLang spell theirs.",
    ),
    Opt("--grammar-compile-timeout-secs", "Seconds a grammar may compile before abort."),
    Opt("--grammar-compile-max-retries", "Compile timeouts after which a grammar is refused for good."),
    Switch(
        "--disable-any-whitespace",
        "Compile JSON grammars without free whitespace (stops models padding with spaces).",
    ),
    Switch(
        "--disable-capturable-grammar",
        "Use the synchronous grammar path even on CUDA (slower; for comparing against the captured one).",
    ),
    Switch("--mla-disable-ragged", "Do not use the ragged prefill wrapper of MLA backends."),
)


SPECULATIVE_FLAGS: tuple[FlagRow, ...] = (
    Switch("--draft-model-path-use-base", "Load the draft model from the base model's path."),
    Opt(
        "--speculative-config",
        'JSON with keys method, model, num_speculative_tokens, e.g. {"method": "eagle3", ...}.',
        aliases=("--speculative_config",),
    ),
    Opt(
        "--speculative-algorithm",
        "Speculative decoding: EAGLE3 (a draft model), NGRAM (prompt lookup, a TokenSpeed choice); MTP and "
        "DFLASH are refused. Speculative batches run synchronously (no overlap scheduling).",
    ),
    Opt("--speculative-draft-model-path", "EAGLE3 draft model directory (Hugging Face layout)."),
    Opt("--speculative-draft-model-quantization", "Quantization of the draft model ('unquant' for none)."),
    Opt("--speculative-num-steps", "Draft steps per verification."),
    Opt("--speculative-eagle-topk", "Candidates per draft step (only chain drafting, 1)."),
    Opt(
        "--speculative-num-draft-tokens",
        "Tokens verified per step: the last token plus N-1 drafted ones (default: num steps + 1).",
    ),
    Opt(
        "--speculative-ngram-min-match-window-size",
        "NGRAM: shortest suffix matched against the request's earlier tokens (a TokenSpeed flag).",
    ),
    Opt(
        "--speculative-ngram-max-match-window-size",
        "NGRAM: longest suffix matched; longer matches are tried first (a TokenSpeed flag).",
    ),
    SwitchPair(
        "--enable-output-logprobs",
        "Answer requests for sampled-token logprobs (chat logprobs, completions logprobs, /generate "
        "return_logprob); on by default.",
        off="--disable-output-logprobs",
        off_help="Refuse requests for logprobs with a 400 naming this flag.",
    ),
    # str: the field also takes the parsed list of layers
    Opt("--eagle3-layers-to-capture", "Comma-separated target layers EAGLE3 reads.", type=str),
)


RUNTIME_OPTION_FLAGS: tuple[FlagRow, ...] = (
    Switch("--disable-pdl", "Do not use programmatic dependent launch."),
    SwitchPair(
        "--enable-prefix-caching",
        "Reuse KV of shared prompt prefixes (default on).",
        off="--no-enable-prefix-caching",
        off_help="Turn prefix caching off.",
    ),
    Switch("--enforce-eager", "Run without CUDA graphs.", aliases=("--disable-cuda-graph",)),
    Switch("--disable-cuda-graph-padding", "Skip CUDA graphs for batches that would need padding."),
    Switch("--enable-cudagraph-gc", "Allow garbage collection during graph capture (slower capture)."),
    Switch("--enable-nccl-nvls", "Use NCCL NVLS for prefill-heavy traffic where available."),
    Switch("--enable-symm-mem", "Use NCCL symmetric memory for collectives."),
    Switch("--disable-custom-all-reduce", "Use NCCL all-reduce instead of the custom kernel."),
    Switch("--disable-overlap-schedule", "Do not overlap CPU scheduling with GPU execution."),
    Switch(
        "--disable-tf32",
        "Do not force TF32 matmuls (the server otherwise sets NVIDIA_TF32_OVERRIDE=1 and "
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1).",
    ),
    Opt("--max-cudagraph-capture-size", "Largest decode batch captured in a CUDA graph."),
    Opt(
        "--cudagraph-capture-sizes",
        "Exact decode batch sizes to capture.",
        metavar="CUDAGRAPH_CAPTURE_SIZE",
        nargs="+",
    ),
    Switch("--disable-prefill-graph", "Run prefill without CUDA graphs."),
    Opt(
        "--prefill-graph-max-tokens",
        "Largest prefill-graph token bucket; unset: min(2048, chunked prefill size); 0: off.",
    ),
    Opt(
        "--prefill-graph-capture-sizes",
        "Exact prefill token buckets; unset: a ladder keeping padding near 12.5%%.",
        metavar="PREFILL_GRAPH_CAPTURE_SIZE",
        nargs="+",
    ),
    Switch(
        "--enable-nan-detection",
        "Replace non-finite logits before sampling and end only the requests that produced them.",
    ),
    Switch("--enable-nvtx", "Emit NVTX ranges per engine stage for nsys (also TOKENSPEED_NVTX=1)."),
    Switch("--enable-p2p-check", "Test GPU peer access instead of trusting the driver's report."),
    Switch("--triton-attention-reduce-in-fp32", "Reduce Triton attention partials in FP32."),
    Switch("--delete-ckpt-after-loading", "Delete the checkpoint files once loaded."),
    Switch(
        "--weight-loader-prefetch-checkpoints",
        "Read checkpoint shards into the page cache ahead of loading, split over local ranks.",
    ),
    Opt("--weight-loader-prefetch-num-threads", "Prefetch threads per rank."),
    Switch("--enable-memory-saver", "Allow releasing and resuming GPU memory through the API."),
    Switch("--enable-custom-logit-processor", "Accept custom logit processors in requests (unsafe)."),
    Switch("--skip-server-warmup", "Start serving without a warmup request."),
    Opt("--warmups", "Comma-separated warmup functions to run before the server accepts requests."),
)


PARALLEL_SIZE_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--tensor-parallel-size",
        "Tensor-parallel size of attention (same as --attn-tp-size; give only one).",
        aliases=("--tp",),
    ),
    Switch("--enable-expert-parallel", "Set the expert-parallel size to the world size."),
    Opt("--attn-tp-size", "Tensor-parallel size of attention layers."),
    Opt("--dense-tp-size", "Tensor-parallel size of dense MLP layers (default: world size)."),
    Opt("--moe-tp-size", "Tensor-parallel size of MoE layers (default: world / EP size)."),
    Opt("--nprocs-per-node", "Ranks per node (default: world size / nnodes)."),
    Opt("--world-size", "Ranks over all nodes (default: TP x CP x DP)."),
    Switch("--force-deterministic-rsag", "Use deterministic reduce-scatter/all-gather."),
    Switch(
        "--disable-sampling-tp-sync",
        "Do not broadcast sampled tokens over the TP group (only safe with deterministic samplers).",
    ),
    Opt("--low-latency-max-num-tokens-per-gpu", "Token cap per GPU of low-latency MoE."),
    Opt(
        "--mla-chunk-multiplier",
        "MLA chunked-prefill capacity per step, as a multiple of --chunked-prefill-size.",
    ),
    Opt("--mm-attention-backend", "Attention kernels of the vision/audio encoders."),
)


DISAGGREGATION_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--disaggregation-mode",
        "Role in disaggregated serving: prefill, decode, encode (vision tower only), or null.",
    ),
    Opt("--comm-fusion-max-num-tokens", "Token capacity of the fused-communication buffer."),
    Switch(
        "--enable-allreduce-fusion",
        "Fuse all-reduce with the following norm (on by default for single-node TP on Hopper+/AMD).",
    ),
    Opt("--disaggregation-bootstrap-port", "Bootstrap port of the prefill server."),
    Opt("--disaggregation-transfer-backend", "KV transfer engine between servers."),
    Opt(
        "--disaggregation-ib-device",
        "InfiniBand device(s) for KV transfer, e.g. mlx5_0 or mlx5_0,mlx5_1; detected when unset.",
    ),
    Opt("--disaggregation-layerwise-interval", "Layers per KV transfer."),
    Opt("--pdlb-url", "Disaggregation load balancer to register this server with."),
)


# Every argument group, in ``--help`` order.
GROUPS: tuple[tuple[str, tuple[FlagRow, ...]], ...] = (
    ("model and tokenizer", MODEL_FLAGS),
    ("memory and scheduling", MEMORY_FLAGS),
    ("kvstore and mamba caches", CACHE_FLAGS),
    ("logging, metrics and API", LOGGING_FLAGS),
    ("parallelism and multi-node", PARALLEL_FLAGS),
    ("kernel backends and structured output", KERNEL_FLAGS),
    ("speculative decoding", SPECULATIVE_FLAGS),
    ("runtime options", RUNTIME_OPTION_FLAGS),
    ("parallel sizes", PARALLEL_SIZE_FLAGS),
    ("disaggregated serving", DISAGGREGATION_FLAGS),
)


def flag_rows() -> Iterator[FlagRow]:
    """Every row of the table, in ``--help`` order."""
    for _title, rows in GROUPS:
        yield from rows
