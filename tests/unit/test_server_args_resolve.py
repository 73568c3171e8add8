"""Every resolution rule of ``ServerArgs``, table-driven, on the values the specification gives.

The platform is passed in, so GPU-dependent defaults are checked on a machine without a GPU.
"""

from __future__ import annotations

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

# (id, argv, platform, {attribute path: expected value})
RULES = [
    # Parallel sizes and world size
    (
        "single rank",
        [],
        AMPERE,
        {"mapping.world_size": 1, "mapping.attn_tp_size": 1, "mapping.attn_dp_size": 1},
    ),
    ("tp sets world", ["--tp", "4"], AMPERE, {"mapping.world_size": 4, "mapping.attn_tp_size": 4}),
    (
        "tp x dp",
        ["--tp", "4", "--data-parallel-size", "2", "--dist-init-addr", "127.0.0.1:4000"],
        AMPERE,
        {
            "mapping.world_size": 8,
            "mapping.attn_tp_size": 4,
            "mapping.attn_dp_size": 2,
            "mapping.dense_tp_size": 8,
        },
    ),
    ("world and tp infer dp", ["--world-size", "8", "--tp", "2"], AMPERE, {"mapping.attn_dp_size": 4}),
    (
        "world alone is tp",
        ["--world-size", "8"],
        AMPERE,
        {"mapping.attn_tp_size": 8, "mapping.attn_dp_size": 1},
    ),
    (
        "world and dp infer tp",
        ["--world-size", "8", "--data-parallel-size", "2"],
        AMPERE,
        {"mapping.attn_tp_size": 4},
    ),
    ("attn-tp-size alias", ["--attn-tp-size", "2"], AMPERE, {"mapping.world_size": 2, "attn_tp_size": 2}),
    ("dense tp given", ["--tp", "4", "--dense-tp-size", "2"], AMPERE, {"mapping.dense_dp_size": 2}),
    ("moe tp follows world", ["--tp", "4"], AMPERE, {"mapping.moe_tp_size": 4, "mapping.moe_ep_size": 1}),
    (
        "nodes",
        ["--tp", "8", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:5000"],
        AMPERE,
        {"mapping.nprocs_per_node": 4, "mapping.nnodes": 2},
    ),
    # Expert parallelism
    (
        "enable-expert-parallel",
        ["--tp", "8", "--enable-expert-parallel"],
        AMPERE,
        {"ep_size": 8, "mapping.moe_ep_size": 8, "mapping.moe_tp_size": 1},
    ),
    ("explicit ep wins", ["--tp", "8", "--ep-size", "8", "--enable-expert-parallel"], AMPERE, {"ep_size": 8}),
    (
        "ep with moe dp",
        ["--tp", "8", "--ep-size", "2", "--moe-tp-size", "1"],
        AMPERE,
        {"mapping.moe_dp_size": 4},
    ),
    # Memory defaults by world size
    ("mem 1 rank", [], AMPERE, {"gpu_memory_utilization": 0.88, "gpu_memory_utilization_defaulted": True}),
    ("mem 2 ranks", ["--tp", "2"], AMPERE, {"gpu_memory_utilization": 0.87}),
    ("mem 4 ranks", ["--tp", "4"], AMPERE, {"gpu_memory_utilization": 0.95}),
    ("mem 8 ranks", ["--tp", "8"], AMPERE, {"gpu_memory_utilization": 0.81}),
    ("mem 16 ranks", ["--tp", "16"], AMPERE, {"gpu_memory_utilization": 0.79}),
    ("mem 32 ranks", ["--world-size", "32"], AMPERE, {"gpu_memory_utilization": 0.79}),
    (
        "mem explicit",
        ["--gpu-memory-utilization", "0.5"],
        AMPERE,
        {"gpu_memory_utilization": 0.5, "gpu_memory_utilization_defaulted": False},
    ),
    ("chunked prefill default", [], AMPERE, {"chunked_prefill_size": 8192}),
    # Capture size and max_num_seqs
    ("capture big gpu", [], AMPERE, {"max_cudagraph_capture_size": 160, "max_num_seqs": 160}),
    ("capture small gpu tp1", [], SMALL_GPU, {"max_cudagraph_capture_size": 8}),
    ("capture small gpu tp2", ["--tp", "2"], SMALL_GPU, {"max_cudagraph_capture_size": 8}),
    ("capture small gpu tp4", ["--tp", "4"], SMALL_GPU, {"max_cudagraph_capture_size": 80}),
    ("capture unknown memory", [], NO_GPU, {"max_cudagraph_capture_size": 160}),
    (
        # the seed halves the largest graph and the batch for speculative decoding
        "capture speculative",
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"],
        AMPERE,
        {"max_cudagraph_capture_size": 80, "max_num_seqs": 80},
    ),
    (
        "capture speculative from its config",
        ["--speculative-config", '{"method": "ngram"}'],
        AMPERE,
        {"max_cudagraph_capture_size": 80, "max_num_seqs": 80},
    ),
    (
        # a small card's graph size wins; the batch is still halved
        "capture speculative small gpu",
        ["--speculative-algorithm", "NGRAM"],
        SMALL_GPU,
        {"max_cudagraph_capture_size": 8, "max_num_seqs": 80},
    ),
    (
        "capture explicit",
        ["--max-cudagraph-capture-size", "32", "--max-num-seqs", "7"],
        SMALL_GPU,
        {"max_cudagraph_capture_size": 32, "max_num_seqs": 7},
    ),
    # Sampling backend by platform
    ("sampling nvidia", [], AMPERE, {"sampling_backend": "flashinfer"}),
    ("sampling amd", [], AMD, {"sampling_backend": "greedy"}),
    ("sampling no gpu", [], NO_GPU, {"sampling_backend": "greedy"}),
    ("sampling explicit", ["--sampling-backend", "triton"], AMPERE, {"sampling_backend": "triton"}),
    # CPU device
    (
        "cpu defaults",
        ["--device", "cpu"],
        HOPPER,
        {
            "attention_backend": "torch",
            "sampling_backend": "torch",
            "enforce_eager": True,
            "disable_prefill_graph": True,
            "enable_kvstore": False,
            "enable_allreduce_fusion": False,
        },
    ),
    (
        "cpu greedy allowed",
        ["--device", "cpu", "--sampling-backend", "greedy"],
        NO_GPU,
        {"sampling_backend": "greedy"},
    ),
    ("cpu keeps memory default", ["--device", "cpu", "--tp", "2"], NO_GPU, {"gpu_memory_utilization": 0.87}),
    # Basic defaults and aliases
    ("tokenizer and name", [], AMPERE, {"tokenizer": "MODEL", "served_model_name": "MODEL"}),
    ("fp8 alias", ["--kv-cache-dtype", "fp8"], AMPERE, {"kv_cache_dtype": "fp8_e4m3"}),
    ("seed kept", ["--seed", "5"], AMPERE, {"seed": 5}),
    (
        "ragged alias off",
        ["--attention-config.use-trtllm-ragged-deepseek-prefill", "false"],
        AMPERE,
        {"mla_disable_ragged": True},
    ),
    (
        "ragged alias on",
        ["--attention_config.use_trtllm_ragged_deepseek_prefill", "--mla-disable-ragged"],
        AMPERE,
        {"mla_disable_ragged": False},
    ),
    # Speculative JSON config
    (
        "spec config",
        ["--speculative-config", EAGLE_CONFIG],
        AMPERE,
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": "draft",
            "speculative_num_steps": 4,
            "speculative_num_draft_tokens": 5,
            "drafter_attention_backend": None,
        },
    ),
    (
        "spec config underscore",
        ["--speculative_config", '{"method": "mtp"}'],
        AMPERE,
        {
            "speculative_algorithm": "MTP",
            "speculative_draft_model_path": "MODEL",
            "draft_model_path_use_base": True,
            "speculative_num_draft_tokens": 4,
        },
    ),
    (
        "spec explicit algorithm wins",
        ["--speculative-algorithm", "MTP", "--speculative-config", EAGLE_CONFIG],
        AMPERE,
        {"speculative_algorithm": "MTP", "speculative_draft_model_path": "draft"},
    ),
    (
        "dflash from config",
        ["--speculative-config", '{"method": "dflash", "model": "d", "num_speculative_tokens": 8}'],
        AMPERE,
        {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8, "speculative_num_steps": 7},
    ),
    (
        "dflash from draft tokens",
        [
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-draft-tokens",
            "6",
        ],
        AMPERE,
        {"speculative_num_steps": 5},
    ),
    (
        "dflash matching steps",
        [
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-draft-tokens",
            "6",
            "--speculative-num-steps",
            "5",
        ],
        AMPERE,
        {"speculative_num_steps": 5},
    ),
    # Draft model rules
    (
        "mtp uses base",
        ["--speculative-algorithm", "MTP"],
        AMPERE,
        {"draft_model_path_use_base": True, "speculative_draft_model_path": "MODEL"},
    ),
    (
        "draft path equal to model",
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "MODEL"],
        AMPERE,
        {"draft_model_path_use_base": True},
    ),
    (
        "use base flag",
        ["--draft-model-path-use-base", "--speculative-algorithm", "EAGLE3"],
        AMPERE,
        {"speculative_draft_model_path": "MODEL"},
    ),
    ("draft unquant", [], AMPERE, {"speculative_draft_model_quantization": None}),
    (
        "draft quant kept",
        ["--speculative-draft-model-quantization", "fp8"],
        AMPERE,
        {"speculative_draft_model_quantization": "fp8"},
    ),
    (
        "drafter backend follows",
        ["--speculative-algorithm", "MTP", "--attention-backend", "fa3"],
        AMPERE,
        {"drafter_attention_backend": "fa3"},
    ),
    (
        "drafter backend explicit",
        [
            "--speculative-algorithm",
            "MTP",
            "--attention-backend",
            "fa3",
            "--drafter-attention-backend",
            "triton",
        ],
        AMPERE,
        {"drafter_attention_backend": "triton"},
    ),
    (
        "eagle3 layers",
        ["--eagle3-layers-to-capture", "2,16,29"],
        AMPERE,
        {"eagle3_layers_to_capture": [2, 16, 29]},
    ),
    # KVStore and Mooncake
    # no KVStore is built, so the GPU default is off (the seed's is on)
    ("kvstore off by default on a GPU", [], HOPPER, {"enable_kvstore": False}),
    (
        "kvstore disabled",
        ["--disable-kvstore", "--no-enable-prefix-caching"],
        AMPERE,
        {"enable_kvstore": False, "enable_prefix_caching": False},
    ),
    ("kvstore off on decode", ["--disaggregation-mode", "decode"], AMPERE, {"enable_kvstore": False}),
    (
        "mooncake layout",
        ["--kvstore-storage-backend", "mooncake", "--kvstore-io-backend", "direct"],
        AMPERE,
        {"kvstore_mem_layout": "page_first", "kvstore_io_backend": "kernel"},
    ),
    (
        "mooncake page_head kept",
        ["--kvstore-storage-backend", "mooncake", "--kvstore-mem-layout", "page_head"],
        AMPERE,
        {"kvstore_mem_layout": "page_head"},
    ),
    (
        "no mooncake keeps layout",
        ["--kvstore-io-backend", "direct"],
        AMPERE,
        {"kvstore_mem_layout": "layer_first", "kvstore_io_backend": "direct"},
    ),
    # Disaggregation
    ("prefill is eager", ["--disaggregation-mode", "prefill"], AMPERE, {"enforce_eager": True}),
    (
        "decode keeps graphs and prefix cache",
        ["--disaggregation-mode", "decode"],
        AMPERE,
        {"enforce_eager": False, "enable_prefix_caching": True},
    ),
    (
        "encode drops prefix cache",
        ["--disaggregation-mode", "encode"],
        AMPERE,
        {"enable_prefix_caching": False, "enable_kvstore": False},
    ),
    (
        "prefill dp round robin",
        [
            "--disaggregation-mode",
            "prefill",
            "--data-parallel-size",
            "2",
            "--load-balance-method",
            "round_robin",
        ],
        AMPERE,
        {"mapping.attn_dp_size": 2},
    ),
    # Allreduce fusion
    (
        "fusion hopper tp",
        ["--tp", "2"],
        HOPPER,
        {"enable_allreduce_fusion": True, "comm_fusion_max_num_tokens": 2048},
    ),
    ("fusion amd tp", ["--tp", "2"], AMD, {"enable_allreduce_fusion": True}),
    ("no fusion ampere", ["--tp", "2"], AMPERE, {"enable_allreduce_fusion": False}),
    ("no fusion tp1", [], HOPPER, {"enable_allreduce_fusion": False}),
    (
        "no fusion multinode",
        ["--tp", "8", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:5000"],
        HOPPER,
        {"enable_allreduce_fusion": False},
    ),
    (
        "no fusion with dp",
        ["--tp", "2", "--data-parallel-size", "2"],
        HOPPER,
        {"enable_allreduce_fusion": False, "comm_fusion_max_num_tokens": -1},
    ),
    (
        "fusion off when dense tp differs",
        ["--tp", "4", "--dense-tp-size", "2", "--enable-allreduce-fusion"],
        HOPPER,
        {"enable_allreduce_fusion": False, "comm_fusion_max_num_tokens": -1},
    ),
    # Expert placement defaults
    (
        "eplb recorder",
        ["--enable-eplb"],
        AMPERE,
        {"expert_distribution_recorder_mode": "stat", "ep_dispatch_algorithm": "static"},
    ),
    ("dispatch from init location", [], AMPERE, {"ep_dispatch_algorithm": "static"}),
    (
        "dispatch explicit",
        ["--ep-dispatch-algorithm", "dynamic"],
        AMPERE,
        {"ep_dispatch_algorithm": "dynamic"},
    ),
    (
        "recorder explicit",
        ["--enable-eplb", "--expert-distribution-recorder-mode", "per_token"],
        AMPERE,
        {"expert_distribution_recorder_mode": "per_token"},
    ),
]


@pytest.mark.parametrize(("argv", "platform", "expected"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_resolution_rule(argv, platform, expected):
    args = resolve(argv, platform)
    for path, value in expected.items():
        assert lookup(args, path) == value, path
