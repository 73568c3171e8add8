"""The ``tokenspeed serve`` flags for kernels, structured output, speculative decoding, runtime options,
parallel sizes and disaggregation."""

from __future__ import annotations

import argparse
from typing import Any

from tokenspeed.server_args_flags import option, str_to_bool_flag, switch


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    _add_kernel_args(parser.add_argument_group("kernel backends and structured output"))
    _add_speculative_args(parser.add_argument_group("speculative decoding"))
    _add_runtime_option_args(parser.add_argument_group("runtime options"))
    _add_parallel_size_args(parser.add_argument_group("parallel sizes"))
    _add_disaggregation_args(parser.add_argument_group("disaggregated serving"))


def _add_kernel_args(g: Any) -> None:
    option(
        g,
        "--attention-backend",
        type=str,
        help="Attention kernels; chosen from hardware and model when unset.",
    )
    option(
        g,
        "--drafter-attention-backend",
        type=str,
        help="Attention kernels of the draft model; defaults to --attention-backend.",
    )
    option(
        g,
        "--sampling-backend",
        type=str,
        help="Sampler. 'greedy' is argmax only (ignores temperature/top-p/top-k); 'flashinfer' and 'triton' "
        "honour temperature/top-k/top-p; the '_full' variants add min-p, penalties and logit bias at the "
        "cost of a per-request token-count buffer; 'torch' is the portable sampler used on the CPU. "
        "Default: flashinfer on NVIDIA, torch on the CPU, greedy elsewhere.",
    )
    switch(g, "--dp-sampling", help="Split speculative verification sampling over the batch (Batch-DP).")
    option(
        g, "--dp-sampling-min-bs", type=int, help="Smallest batch that uses --dp-sampling (default 2 x TP)."
    )
    str_to_bool_flag(
        g,
        "--attention-use-fp4-indexer-cache",
        "--attention-config.use-fp4-indexer-cache",
        "--attention_config.use_fp4_indexer_cache",
        help="Store the sparse-attention indexer cache as MXFP4.",
    )
    str_to_bool_flag(
        g,
        "--attention-config.use-trtllm-ragged-deepseek-prefill",
        "--attention-config.use_trtllm_ragged_deepseek_prefill",
        "--attention_config.use_trtllm_ragged_deepseek_prefill",
        dest="use_trtllm_ragged_deepseek_prefill",
        help="Use the ragged prefill kernel for DeepSeek MLA (false is the same as --mla-disable-ragged).",
    )
    option(
        g,
        "--deepseek-v4-mega-moe-max-num-tokens",
        type=int,
        help="Token cap of the DeepSeek V4 MegaMoE staging buffer (0: derive from prefill/graph budgets).",
    )
    option(
        g,
        "--deepseek-v4-indexer-prefill-max-logits-mb",
        type=int,
        help="MiB cap of the DeepSeek V4 sparse-indexer prefill logits workspace.",
    )
    option(g, "--deepseek-v4-prefill-chunk-size", type=int, help="Requests per DeepSeek V4 prefill chunk.")
    option(g, "--grammar-backend", type=str, help="Structured-output backend; 'none' turns it off.")
    option(
        g,
        "--reasoning-parser",
        type=str,
        help="Reasoning parser (e.g. minimax, kimi_k25); JSON-schema grammars then start after reasoning.",
    )
    option(
        g, "--grammar-compile-timeout-secs", type=float, help="Seconds a grammar may compile before abort."
    )
    option(
        g,
        "--grammar-compile-max-retries",
        type=int,
        help="Compile timeouts after which a grammar is refused for good.",
    )
    switch(
        g,
        "--disable-any-whitespace",
        help="Compile JSON grammars without free whitespace (stops models padding with spaces). xgrammar only.",
    )
    switch(
        g,
        "--disable-capturable-grammar",
        help="Use the synchronous grammar path even on CUDA (slower; for comparing against the captured one).",
    )
    switch(g, "--mla-disable-ragged", help="Do not use the ragged prefill wrapper of MLA backends.")


def _add_speculative_args(g: Any) -> None:
    switch(g, "--draft-model-path-use-base", help="Load the draft model from the base model's path.")
    option(
        g,
        "--speculative-config",
        "--speculative_config",
        type=str,
        help='JSON with keys method, model, num_speculative_tokens, e.g. {"method": "eagle3", ...}.',
    )
    option(g, "--speculative-algorithm", type=str, help="Speculative decoding algorithm.")
    option(g, "--speculative-draft-model-path", type=str, help="Draft model directory or repo id.")
    option(
        g,
        "--speculative-draft-model-quantization",
        type=str,
        help="Quantization of the draft model ('unquant' for none).",
    )
    option(g, "--speculative-num-steps", type=int, help="Draft steps per verification.")
    option(
        g, "--speculative-eagle-topk", type=int, help="Candidates per draft step (only chain drafting, 1)."
    )
    option(g, "--speculative-num-draft-tokens", type=int, help="Draft tokens verified per step.")
    switch(
        g,
        "--enable-output-logprobs",
        help="Compute sampled-token logprobs (more graph memory); without it requested logprobs are empty.",
    )
    option(g, "--eagle3-layers-to-capture", type=str, help="Comma-separated target layers EAGLE3 reads.")


def _add_runtime_option_args(g: Any) -> None:
    switch(g, "--disable-pdl", help="Do not use programmatic dependent launch.")
    prefix = g.add_mutually_exclusive_group()
    switch(prefix, "--enable-prefix-caching", help="Reuse KV of shared prompt prefixes (default on).")
    prefix.add_argument(
        "--no-enable-prefix-caching",
        dest="enable_prefix_caching",
        action="store_false",
        help="Turn prefix caching off.",
    )
    switch(
        g, "--enforce-eager", "--disable-cuda-graph", dest="enforce_eager", help="Run without CUDA graphs."
    )
    switch(g, "--disable-cuda-graph-padding", help="Skip CUDA graphs for batches that would need padding.")
    switch(g, "--enable-cudagraph-gc", help="Allow garbage collection during graph capture (slower capture).")
    switch(g, "--enable-nccl-nvls", help="Use NCCL NVLS for prefill-heavy traffic where available.")
    switch(g, "--enable-symm-mem", help="Use NCCL symmetric memory for collectives.")
    switch(g, "--disable-custom-all-reduce", help="Use NCCL all-reduce instead of the custom kernel.")
    switch(g, "--disable-overlap-schedule", help="Do not overlap CPU scheduling with GPU execution.")
    switch(
        g,
        "--disable-tf32",
        help="Do not force TF32 matmuls (the server otherwise sets NVIDIA_TF32_OVERRIDE=1 and "
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1).",
    )
    option(
        g,
        "--max-cudagraph-capture-size",
        metavar="MAX_CUDAGRAPH_CAPTURE_SIZE",
        type=int,
        help="Largest decode batch captured in a CUDA graph.",
    )
    option(
        g,
        "--cudagraph-capture-sizes",
        metavar="CUDAGRAPH_CAPTURE_SIZE",
        type=int,
        nargs="+",
        help="Exact decode batch sizes to capture.",
    )
    switch(g, "--disable-prefill-graph", help="Run prefill without CUDA graphs.")
    option(
        g,
        "--prefill-graph-max-tokens",
        type=int,
        help="Largest prefill-graph token bucket; unset: min(2048, chunked prefill size); 0: off.",
    )
    option(
        g,
        "--prefill-graph-capture-sizes",
        metavar="PREFILL_GRAPH_CAPTURE_SIZE",
        type=int,
        nargs="+",
        help="Exact prefill token buckets; unset: a ladder keeping padding near 12.5%%.",
    )
    switch(
        g,
        "--enable-nan-detection",
        help="Replace non-finite logits before sampling and end only the requests that produced them.",
    )
    switch(g, "--enable-nvtx", help="Emit NVTX ranges per engine stage for nsys (also TOKENSPEED_NVTX=1).")
    switch(g, "--enable-p2p-check", help="Test GPU peer access instead of trusting the driver's report.")
    switch(g, "--triton-attention-reduce-in-fp32", help="Reduce Triton attention partials in FP32.")
    switch(g, "--delete-ckpt-after-loading", help="Delete the checkpoint files once loaded.")
    switch(
        g,
        "--weight-loader-prefetch-checkpoints",
        help="Read checkpoint shards into the page cache ahead of loading, split over local ranks.",
    )
    option(g, "--weight-loader-prefetch-num-threads", type=int, help="Prefetch threads per rank.")
    switch(g, "--enable-memory-saver", help="Allow releasing and resuming GPU memory through the API.")
    switch(g, "--enable-custom-logit-processor", help="Accept custom logit processors in requests (unsafe).")
    switch(g, "--skip-server-warmup", help="Start serving without a warmup request.")
    option(
        g,
        "--warmups",
        type=str,
        help="Comma-separated warmup functions to run before the server accepts requests.",
    )


def _add_parallel_size_args(g: Any) -> None:
    option(
        g,
        "--tensor-parallel-size",
        "--tp",
        type=int,
        default=None,
        help="Tensor-parallel size of attention (same as --attn-tp-size; give only one).",
    )
    switch(g, "--enable-expert-parallel", help="Set the expert-parallel size to the world size.")
    option(g, "--attn-tp-size", type=int, help="Tensor-parallel size of attention layers.")
    option(
        g, "--dense-tp-size", type=int, help="Tensor-parallel size of dense MLP layers (default: world size)."
    )
    option(
        g, "--moe-tp-size", type=int, help="Tensor-parallel size of MoE layers (default: world / EP size)."
    )
    option(g, "--nprocs-per-node", type=int, help="Ranks per node (default: world size / nnodes).")
    option(g, "--world-size", type=int, help="Ranks over all nodes (default: TP x CP x DP).")
    switch(g, "--force-deterministic-rsag", help="Use deterministic reduce-scatter/all-gather.")
    switch(
        g,
        "--disable-sampling-tp-sync",
        help="Do not broadcast sampled tokens over the TP group (only safe with deterministic samplers).",
    )
    option(g, "--low-latency-max-num-tokens-per-gpu", type=int, help="Token cap per GPU of low-latency MoE.")
    option(
        g,
        "--mla-chunk-multiplier",
        type=int,
        help="MLA chunked-prefill capacity per step, as a multiple of --chunked-prefill-size.",
    )
    option(g, "--mm-attention-backend", type=str, help="Attention kernels of the vision/audio encoders.")


def _add_disaggregation_args(g: Any) -> None:
    option(
        g,
        "--disaggregation-mode",
        type=str,
        help="Role in disaggregated serving: prefill, decode, encode (vision tower only), or null.",
    )
    option(
        g, "--comm-fusion-max-num-tokens", type=int, help="Token capacity of the fused-communication buffer."
    )
    switch(
        g,
        "--enable-allreduce-fusion",
        help="Fuse all-reduce with the following norm (on by default for single-node TP on Hopper+/AMD).",
    )
    option(g, "--disaggregation-bootstrap-port", type=int, help="Bootstrap port of the prefill server.")
    option(g, "--disaggregation-transfer-backend", type=str, help="KV transfer engine between servers.")
    option(
        g,
        "--disaggregation-ib-device",
        type=str,
        help="InfiniBand device(s) for KV transfer, e.g. mlx5_0 or mlx5_0,mlx5_1; detected when unset.",
    )
    option(g, "--disaggregation-layerwise-interval", type=int, help="Layers per KV transfer.")
    option(g, "--pdlb-url", type=str, help="Disaggregation load balancer to register this server with.")
