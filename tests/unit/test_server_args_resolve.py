"""Every resolution rule of ``ServerArgs``, table-driven, on the values the specification gives.

The platform is passed in, so GPU-dependent defaults are checked on a machine without a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.resolve import PlatformFacts
from tokenspeed.config.server_args import ServerArgs

HOPPER = PlatformFacts("nvidia", is_hopper_or_newer=True, gpu_memory_gb=80.0)
AMPERE = PlatformFacts("nvidia", is_hopper_or_newer=False, gpu_memory_gb=80.0)
SMALL_GPU = PlatformFacts("nvidia", is_hopper_or_newer=False, gpu_memory_gb=16.0)
AMD = PlatformFacts("amd", is_hopper_or_newer=False, gpu_memory_gb=192.0)
NO_GPU = PlatformFacts("cpu")


def resolve(argv: list[str], platform=AMPERE, model: str = "MODEL") -> ServerArgs:
    return prepare_server_args([model, *argv], platform=platform)


def lookup(args: ServerArgs, path: str):
    value = args
    for part in path.split("."):
        value = getattr(value, part)
    return value


EAGLE_CONFIG = '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 4}'
DFLASH_6_DRAFT_TOKENS = [
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-draft-model-path",
    "d",
    "--speculative-num-draft-tokens",
    "6",
]


def rule(name: str, argv: list[str], expected: dict[str, Any], platform: PlatformFacts = AMPERE) -> Any:
    """`argv` resolved on `platform` (an 80 GB Ampere card unless named) sets every attribute path in
    `expected` to its value."""
    return pytest.param(argv, platform, expected, id=name)


RULES = [
    # Parallel sizes and world size
    rule("single rank", [], {"mapping.world_size": 1, "mapping.attn_tp_size": 1, "mapping.attn_dp_size": 1}),
    rule("tp sets world", ["--tp", "4"], {"mapping.world_size": 4, "mapping.attn_tp_size": 4}),
    rule(
        "tp x dp",
        ["--tp", "4", "--data-parallel-size", "2", "--dist-init-addr", "127.0.0.1:4000"],
        {
            "mapping.world_size": 8,
            "mapping.attn_tp_size": 4,
            "mapping.attn_dp_size": 2,
            "mapping.dense_tp_size": 8,
        },
    ),
    rule("world and tp infer dp", ["--world-size", "8", "--tp", "2"], {"mapping.attn_dp_size": 4}),
    rule("world alone is tp", ["--world-size", "8"], {"mapping.attn_tp_size": 8, "mapping.attn_dp_size": 1}),
    rule(
        "world and dp infer tp",
        ["--world-size", "8", "--data-parallel-size", "2"],
        {"mapping.attn_tp_size": 4},
    ),
    rule("attn-tp-size alias", ["--attn-tp-size", "2"], {"mapping.world_size": 2, "attn_tp_size": 2}),
    rule("dense tp given", ["--tp", "4", "--dense-tp-size", "2"], {"mapping.dense_dp_size": 2}),
    rule("moe tp follows world", ["--tp", "4"], {"mapping.moe_tp_size": 4, "mapping.moe_ep_size": 1}),
    rule(
        "nodes",
        ["--tp", "8", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:5000"],
        {"mapping.nprocs_per_node": 4, "mapping.nnodes": 2},
    ),
    # Expert parallelism
    rule(
        "enable-expert-parallel",
        ["--tp", "8", "--enable-expert-parallel"],
        {"ep_size": 8, "mapping.moe_ep_size": 8, "mapping.moe_tp_size": 1},
    ),
    rule("explicit ep wins", ["--tp", "8", "--ep-size", "8", "--enable-expert-parallel"], {"ep_size": 8}),
    rule("ep with moe dp", ["--tp", "8", "--ep-size", "2", "--moe-tp-size", "1"], {"mapping.moe_dp_size": 4}),
    # Memory defaults by world size
    rule("mem 1 rank", [], {"gpu_memory_utilization": 0.88, "gpu_memory_utilization_defaulted": True}),
    rule("mem 2 ranks", ["--tp", "2"], {"gpu_memory_utilization": 0.87}),
    rule("mem 4 ranks", ["--tp", "4"], {"gpu_memory_utilization": 0.95}),
    rule("mem 8 ranks", ["--tp", "8"], {"gpu_memory_utilization": 0.81}),
    rule("mem 16 ranks", ["--tp", "16"], {"gpu_memory_utilization": 0.79}),
    rule("mem 32 ranks", ["--world-size", "32"], {"gpu_memory_utilization": 0.79}),
    rule(
        "mem explicit",
        ["--gpu-memory-utilization", "0.5"],
        {"gpu_memory_utilization": 0.5, "gpu_memory_utilization_defaulted": False},
    ),
    rule("chunked prefill default", [], {"chunked_prefill_size": 8192}),
    # Capture size and max_num_seqs
    rule("capture big gpu", [], {"max_cudagraph_capture_size": 160, "max_num_seqs": 160}),
    rule("capture small gpu tp1", [], {"max_cudagraph_capture_size": 8}, platform=SMALL_GPU),
    rule("capture small gpu tp2", ["--tp", "2"], {"max_cudagraph_capture_size": 8}, platform=SMALL_GPU),
    rule("capture small gpu tp4", ["--tp", "4"], {"max_cudagraph_capture_size": 80}, platform=SMALL_GPU),
    rule("capture unknown memory", [], {"max_cudagraph_capture_size": 160}, platform=NO_GPU),
    # the seed halves the largest graph and the batch for speculative decoding
    rule(
        "capture speculative",
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"],
        {"max_cudagraph_capture_size": 80, "max_num_seqs": 80},
    ),
    rule(
        "capture speculative from its config",
        ["--speculative-config", '{"method": "ngram"}'],
        {"max_cudagraph_capture_size": 80, "max_num_seqs": 80},
    ),
    # a small card's graph size wins; the batch is still halved
    rule(
        "capture speculative small gpu",
        ["--speculative-algorithm", "NGRAM"],
        {"max_cudagraph_capture_size": 8, "max_num_seqs": 80},
        platform=SMALL_GPU,
    ),
    rule(
        "capture explicit",
        ["--max-cudagraph-capture-size", "32", "--max-num-seqs", "7"],
        {"max_cudagraph_capture_size": 32, "max_num_seqs": 7},
        platform=SMALL_GPU,
    ),
    # Sampling backend by platform
    rule("sampling nvidia", [], {"sampling_backend": "flashinfer"}),
    rule("sampling amd", [], {"sampling_backend": "greedy"}, platform=AMD),
    rule("sampling no gpu", [], {"sampling_backend": "greedy"}, platform=NO_GPU),
    rule("sampling explicit", ["--sampling-backend", "triton"], {"sampling_backend": "triton"}),
    # CPU device
    rule(
        "cpu defaults",
        ["--device", "cpu"],
        {
            "attention_backend": "torch",
            "sampling_backend": "torch",
            "enforce_eager": True,
            "disable_prefill_graph": True,
            "enable_kvstore": False,
            "enable_allreduce_fusion": False,
        },
        platform=HOPPER,
    ),
    rule(
        "cpu greedy allowed",
        ["--device", "cpu", "--sampling-backend", "greedy"],
        {"sampling_backend": "greedy"},
        platform=NO_GPU,
    ),
    rule(
        "cpu keeps memory default",
        ["--device", "cpu", "--tp", "2"],
        {"gpu_memory_utilization": 0.87},
        platform=NO_GPU,
    ),
    # Basic defaults and aliases
    rule("tokenizer and name", [], {"tokenizer": "MODEL", "served_model_name": "MODEL"}),
    rule("fp8 alias", ["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8_e4m3"}),
    rule("seed kept", ["--seed", "5"], {"seed": 5}),
    rule(
        "ragged alias off",
        ["--attention-config.use-trtllm-ragged-deepseek-prefill", "false"],
        {"mla_disable_ragged": True},
    ),
    rule(
        "ragged alias on",
        ["--attention_config.use_trtllm_ragged_deepseek_prefill", "--mla-disable-ragged"],
        {"mla_disable_ragged": False},
    ),
    # Speculative JSON config
    rule(
        "spec config",
        ["--speculative-config", EAGLE_CONFIG],
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": "draft",
            "speculative_num_steps": 4,
            "speculative_num_draft_tokens": 5,
            "drafter_attention_backend": None,
        },
    ),
    rule(
        "spec config underscore",
        ["--speculative_config", '{"method": "mtp"}'],
        {
            "speculative_algorithm": "MTP",
            "speculative_draft_model_path": "MODEL",
            "draft_model_path_use_base": True,
            "speculative_num_draft_tokens": 4,
        },
    ),
    rule(
        "spec explicit algorithm wins",
        ["--speculative-algorithm", "MTP", "--speculative-config", EAGLE_CONFIG],
        {"speculative_algorithm": "MTP", "speculative_draft_model_path": "draft"},
    ),
    rule(
        "dflash from config",
        ["--speculative-config", '{"method": "dflash", "model": "d", "num_speculative_tokens": 8}'],
        {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8, "speculative_num_steps": 7},
    ),
    rule("dflash from draft tokens", DFLASH_6_DRAFT_TOKENS, {"speculative_num_steps": 5}),
    rule(
        "dflash matching steps",
        [*DFLASH_6_DRAFT_TOKENS, "--speculative-num-steps", "5"],
        {"speculative_num_steps": 5},
    ),
    # Draft model rules
    rule(
        "mtp uses base",
        ["--speculative-algorithm", "MTP"],
        {"draft_model_path_use_base": True, "speculative_draft_model_path": "MODEL"},
    ),
    rule(
        "draft path equal to model",
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "MODEL"],
        {"draft_model_path_use_base": True},
    ),
    rule(
        "use base flag",
        ["--draft-model-path-use-base", "--speculative-algorithm", "EAGLE3"],
        {"speculative_draft_model_path": "MODEL"},
    ),
    rule("draft unquant", [], {"speculative_draft_model_quantization": None}),
    rule(
        "draft quant kept",
        ["--speculative-draft-model-quantization", "fp8"],
        {"speculative_draft_model_quantization": "fp8"},
    ),
    rule(
        "drafter backend follows",
        ["--speculative-algorithm", "MTP", "--attention-backend", "fa3"],
        {"drafter_attention_backend": "fa3"},
    ),
    rule(
        "drafter backend explicit",
        [
            "--speculative-algorithm",
            "MTP",
            "--attention-backend",
            "fa3",
            "--drafter-attention-backend",
            "triton",
        ],
        {"drafter_attention_backend": "triton"},
    ),
    rule(
        "eagle3 layers", ["--eagle3-layers-to-capture", "2,16,29"], {"eagle3_layers_to_capture": [2, 16, 29]}
    ),
    # KVStore and Mooncake
    # no KVStore is built, so the GPU default is off (the seed's is on)
    rule("kvstore off by default on a GPU", [], {"enable_kvstore": False}, platform=HOPPER),
    rule(
        "kvstore disabled",
        ["--disable-kvstore", "--no-enable-prefix-caching"],
        {"enable_kvstore": False, "enable_prefix_caching": False},
    ),
    rule("kvstore off on decode", ["--disaggregation-mode", "decode"], {"enable_kvstore": False}),
    rule(
        "mooncake layout",
        ["--kvstore-storage-backend", "mooncake", "--kvstore-io-backend", "direct"],
        {"kvstore_mem_layout": "page_first", "kvstore_io_backend": "kernel"},
    ),
    rule(
        "mooncake page_head kept",
        ["--kvstore-storage-backend", "mooncake", "--kvstore-mem-layout", "page_head"],
        {"kvstore_mem_layout": "page_head"},
    ),
    rule(
        "no mooncake keeps layout",
        ["--kvstore-io-backend", "direct"],
        {"kvstore_mem_layout": "layer_first", "kvstore_io_backend": "direct"},
    ),
    # Disaggregation
    rule("prefill is eager", ["--disaggregation-mode", "prefill"], {"enforce_eager": True}),
    rule(
        "decode keeps graphs and prefix cache",
        ["--disaggregation-mode", "decode"],
        {"enforce_eager": False, "enable_prefix_caching": True},
    ),
    rule(
        "encode drops prefix cache",
        ["--disaggregation-mode", "encode"],
        {"enable_prefix_caching": False, "enable_kvstore": False},
    ),
    rule(
        "prefill dp round robin",
        [
            "--disaggregation-mode",
            "prefill",
            "--data-parallel-size",
            "2",
            "--load-balance-method",
            "round_robin",
        ],
        {"mapping.attn_dp_size": 2},
    ),
    # Allreduce fusion
    rule(
        "fusion hopper tp",
        ["--tp", "2"],
        {"enable_allreduce_fusion": True, "comm_fusion_max_num_tokens": 2048},
        platform=HOPPER,
    ),
    rule("fusion amd tp", ["--tp", "2"], {"enable_allreduce_fusion": True}, platform=AMD),
    rule("no fusion ampere", ["--tp", "2"], {"enable_allreduce_fusion": False}),
    rule("no fusion tp1", [], {"enable_allreduce_fusion": False}, platform=HOPPER),
    rule(
        "no fusion multinode",
        ["--tp", "8", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:5000"],
        {"enable_allreduce_fusion": False},
        platform=HOPPER,
    ),
    rule(
        "no fusion with dp",
        ["--tp", "2", "--data-parallel-size", "2"],
        {"enable_allreduce_fusion": False, "comm_fusion_max_num_tokens": -1},
        platform=HOPPER,
    ),
    rule(
        "fusion off when dense tp differs",
        ["--tp", "4", "--dense-tp-size", "2", "--enable-allreduce-fusion"],
        {"enable_allreduce_fusion": False, "comm_fusion_max_num_tokens": -1},
        platform=HOPPER,
    ),
    # Expert placement defaults
    rule(
        "eplb recorder",
        ["--enable-eplb"],
        {"expert_distribution_recorder_mode": "stat", "ep_dispatch_algorithm": "static"},
    ),
    rule("dispatch from init location", [], {"ep_dispatch_algorithm": "static"}),
    rule("dispatch explicit", ["--ep-dispatch-algorithm", "dynamic"], {"ep_dispatch_algorithm": "dynamic"}),
    rule(
        "recorder explicit",
        ["--enable-eplb", "--expert-distribution-recorder-mode", "per_token"],
        {"expert_distribution_recorder_mode": "per_token"},
    ),
]


@pytest.mark.parametrize(("argv", "platform", "expected"), RULES)
def test_resolution_rule(argv, platform, expected):
    args = resolve(argv, platform)
    for path, value in expected.items():
        assert lookup(args, path) == value, path
