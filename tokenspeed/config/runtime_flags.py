"""The ``tokenspeed serve`` flag tables for kernels, structured output, speculative decoding, runtime options,
parallel sizes and disaggregation; ``config.cli`` places them after its own groups."""

from __future__ import annotations

from tokenspeed.config.flag_table import FlagRow, Opt, OptionalBool, Switch, SwitchPair

KERNEL_FLAGS: tuple[FlagRow, ...] = (
    Opt("--attention-backend", str, "Attention kernels; chosen from hardware and model when unset."),
    Opt(
        "--drafter-attention-backend",
        str,
        "Attention kernels of the draft model; defaults to --attention-backend.",
    ),
    Opt(
        "--sampling-backend",
        str,
        "Sampler. 'greedy' is argmax only (ignores temperature/top-p/top-k); 'flashinfer' and 'triton' "
        "honour temperature/top-k/top-p; the '_full' variants add min-p, penalties and logit bias at the "
        "cost of a per-request token-count buffer; 'torch' is the portable sampler used on the CPU. "
        "Default: flashinfer on NVIDIA, torch on the CPU, greedy elsewhere.",
    ),
    Switch("--dp-sampling", "Split speculative verification sampling over the batch (Batch-DP)."),
    Opt("--dp-sampling-min-bs", int, "Smallest batch that uses --dp-sampling (default 2 x TP)."),
    OptionalBool(
        (
            "--attention-use-fp4-indexer-cache",
            "--attention-config.use-fp4-indexer-cache",
            "--attention_config.use_fp4_indexer_cache",
        ),
        "Store the sparse-attention indexer cache as MXFP4.",
    ),
    OptionalBool(
        (
            "--attention-config.use-trtllm-ragged-deepseek-prefill",
            "--attention-config.use_trtllm_ragged_deepseek_prefill",
            "--attention_config.use_trtllm_ragged_deepseek_prefill",
        ),
        "Use the ragged prefill kernel for DeepSeek MLA (false is the same as --mla-disable-ragged).",
        dest="use_trtllm_ragged_deepseek_prefill",
    ),
    Opt(
        "--deepseek-v4-mega-moe-max-num-tokens",
        int,
        "Token cap of the DeepSeek V4 MegaMoE staging buffer (0: derive from prefill/graph budgets).",
    ),
    Opt(
        "--deepseek-v4-indexer-prefill-max-logits-mb",
        int,
        "MiB cap of the DeepSeek V4 sparse-indexer prefill logits workspace.",
    ),
    Opt("--deepseek-v4-prefill-chunk-size", int, "Requests per DeepSeek V4 prefill chunk."),
    Opt(
        "--grammar-backend",
        str,
        "Structured output (response_format, guided_*, structured_outputs, tool_choice required or named): "
        "xgrammar (default) or llguidance; 'none' turns it off and such requests get a 400.",
    ),
    Opt(
        "--reasoning-parser",
        str,
        "Moves the model's <think>...</think> section to reasoning_content, and starts JSON-schema "
        "grammars after it: qwen3 (the output opens <think>) or deepseek-r1 (the prompt opened it).",
    ),
    Opt(
        "--tool-call-parser",
        str,
        "How tool calls are read from the model's text for tool_choice auto: hermes (Qwen's <tool_call> "
        "JSON) or llama3_json. A TokenSpeed flag, spelled as vLLM and SGLang spell theirs.",
    ),
    Opt("--grammar-compile-timeout-secs", float, "Seconds a grammar may compile before abort."),
    Opt("--grammar-compile-max-retries", int, "Compile timeouts after which a grammar is refused for good."),
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
        str,
        'JSON with keys method, model, num_speculative_tokens, e.g. {"method": "eagle3", ...}.',
        aliases=("--speculative_config",),
    ),
    Opt(
        "--speculative-algorithm",
        str,
        "Speculative decoding: EAGLE3 (a draft model), NGRAM (prompt lookup, a TokenSpeed choice); MTP and "
        "DFLASH are refused. Speculative batches run synchronously (no overlap scheduling).",
    ),
    Opt("--speculative-draft-model-path", str, "EAGLE3 draft model directory (Hugging Face layout)."),
    Opt(
        "--speculative-draft-model-quantization", str, "Quantization of the draft model ('unquant' for none)."
    ),
    Opt("--speculative-num-steps", int, "Draft steps per verification."),
    Opt("--speculative-eagle-topk", int, "Candidates per draft step (only chain drafting, 1)."),
    Opt(
        "--speculative-num-draft-tokens",
        int,
        "Tokens verified per step: the last token plus N-1 drafted ones (default: num steps + 1).",
    ),
    Opt(
        "--speculative-ngram-min-match-window-size",
        int,
        "NGRAM: shortest suffix matched against the request's earlier tokens (a TokenSpeed flag).",
    ),
    Opt(
        "--speculative-ngram-max-match-window-size",
        int,
        "NGRAM: longest suffix matched; longer matches are tried first (a TokenSpeed flag).",
    ),
    SwitchPair(
        "--enable-output-logprobs",
        "--disable-output-logprobs",
        "Answer requests for sampled-token logprobs (chat logprobs, completions logprobs, /generate "
        "return_logprob); on by default.",
        "Refuse requests for logprobs with a 400 naming this flag.",
    ),
    Opt("--eagle3-layers-to-capture", str, "Comma-separated target layers EAGLE3 reads."),
)


RUNTIME_OPTION_FLAGS: tuple[FlagRow, ...] = (
    Switch("--disable-pdl", "Do not use programmatic dependent launch."),
    SwitchPair(
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "Reuse KV of shared prompt prefixes (default on).",
        "Turn prefix caching off.",
    ),
    Switch(
        "--enforce-eager", "Run without CUDA graphs.", aliases=("--disable-cuda-graph",), dest="enforce_eager"
    ),
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
    Opt(
        "--max-cudagraph-capture-size",
        int,
        "Largest decode batch captured in a CUDA graph.",
        metavar="MAX_CUDAGRAPH_CAPTURE_SIZE",
    ),
    Opt(
        "--cudagraph-capture-sizes",
        int,
        "Exact decode batch sizes to capture.",
        metavar="CUDAGRAPH_CAPTURE_SIZE",
        nargs="+",
    ),
    Switch("--disable-prefill-graph", "Run prefill without CUDA graphs."),
    Opt(
        "--prefill-graph-max-tokens",
        int,
        "Largest prefill-graph token bucket; unset: min(2048, chunked prefill size); 0: off.",
    ),
    Opt(
        "--prefill-graph-capture-sizes",
        int,
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
    Opt("--weight-loader-prefetch-num-threads", int, "Prefetch threads per rank."),
    Switch("--enable-memory-saver", "Allow releasing and resuming GPU memory through the API."),
    Switch("--enable-custom-logit-processor", "Accept custom logit processors in requests (unsafe)."),
    Switch("--skip-server-warmup", "Start serving without a warmup request."),
    Opt("--warmups", str, "Comma-separated warmup functions to run before the server accepts requests."),
)


PARALLEL_SIZE_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--tensor-parallel-size",
        int,
        "Tensor-parallel size of attention (same as --attn-tp-size; give only one).",
        aliases=("--tp",),
        default=None,
    ),
    Switch("--enable-expert-parallel", "Set the expert-parallel size to the world size."),
    Opt("--attn-tp-size", int, "Tensor-parallel size of attention layers."),
    Opt("--dense-tp-size", int, "Tensor-parallel size of dense MLP layers (default: world size)."),
    Opt("--moe-tp-size", int, "Tensor-parallel size of MoE layers (default: world / EP size)."),
    Opt("--nprocs-per-node", int, "Ranks per node (default: world size / nnodes)."),
    Opt("--world-size", int, "Ranks over all nodes (default: TP x CP x DP)."),
    Switch("--force-deterministic-rsag", "Use deterministic reduce-scatter/all-gather."),
    Switch(
        "--disable-sampling-tp-sync",
        "Do not broadcast sampled tokens over the TP group (only safe with deterministic samplers).",
    ),
    Opt("--low-latency-max-num-tokens-per-gpu", int, "Token cap per GPU of low-latency MoE."),
    Opt(
        "--mla-chunk-multiplier",
        int,
        "MLA chunked-prefill capacity per step, as a multiple of --chunked-prefill-size.",
    ),
    Opt("--mm-attention-backend", str, "Attention kernels of the vision/audio encoders."),
)


DISAGGREGATION_FLAGS: tuple[FlagRow, ...] = (
    Opt(
        "--disaggregation-mode",
        str,
        "Role in disaggregated serving: prefill, decode, encode (vision tower only), or null.",
    ),
    Opt("--comm-fusion-max-num-tokens", int, "Token capacity of the fused-communication buffer."),
    Switch(
        "--enable-allreduce-fusion",
        "Fuse all-reduce with the following norm (on by default for single-node TP on Hopper+/AMD).",
    ),
    Opt("--disaggregation-bootstrap-port", int, "Bootstrap port of the prefill server."),
    Opt("--disaggregation-transfer-backend", str, "KV transfer engine between servers."),
    Opt(
        "--disaggregation-ib-device",
        str,
        "InfiniBand device(s) for KV transfer, e.g. mlx5_0 or mlx5_0,mlx5_1; detected when unset.",
    ),
    Opt("--disaggregation-layerwise-interval", int, "Layers per KV transfer."),
    Opt("--pdlb-url", str, "Disaggregation load balancer to register this server with."),
)
