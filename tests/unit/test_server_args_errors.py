"""Every validation error of ``ServerArgs``: a ``ValueError`` naming the flag and the fix."""

from __future__ import annotations

import pytest

from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.resolve import PlatformFacts
from tokenspeed.config.server_args import ServerArgs

AMPERE = PlatformFacts("nvidia", is_hopper_or_newer=False, gpu_memory_gb=80.0)
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d"]

# (id, argv after the model, words the message must contain)
CLI_ERRORS = [
    ("world not divisible", ["--world-size", "6", "--tp", "4"], ["world_size=6", "--tp"]),
    (
        "sizes do not multiply",
        ["--world-size", "8", "--tp", "2", "--data-parallel-size", "2"],
        ["--world-size"],
    ),
    ("moe tp and ep", ["--tp", "8", "--ep-size", "2"], ["--moe-tp-size 1", "--ep-size"]),
    ("ep does not divide", ["--tp", "8", "--ep-size", "3"], ["--ep-size"]),
    ("nprocs mismatch", ["--tp", "8", "--nprocs-per-node", "3"], ["--nprocs-per-node"]),
    ("nodes do not divide", ["--tp", "6", "--nnodes", "4", "--dist-init-addr", "h:1"], ["--nnodes"]),
    ("multinode needs addr", ["--tp", "8", "--nnodes", "2"], ["--dist-init-addr"]),
    ("node rank range", ["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], ["--node-rank"]),
    (
        "dp group led from a worker node",
        ["--tp", "2", "--data-parallel-size", "2", "--nnodes", "2", "--dist-init-addr", "h:1"],
        ["--data-parallel-size 2", "--nnodes 2", "node 1", "one server per node"],
    ),
    ("max_num_seqs below dp", ["--data-parallel-size", "4", "--max-num-seqs", "2"], ["--max-num-seqs"]),
    (
        "chunk above prefill budget with dp",
        ["--data-parallel-size", "2", "--chunked-prefill-size", "16384"],
        ["--max-prefill-tokens"],
    ),
    ("deepseek chunk", ["--deepseek-v4-prefill-chunk-size", "0"], ["--deepseek-v4-prefill-chunk-size"]),
    (
        "encode with dp",
        ["--disaggregation-mode", "encode", "--data-parallel-size", "2"],
        ["--data-parallel-size"],
    ),
    (
        "prefill dp balance",
        ["--disaggregation-mode", "prefill", "--data-parallel-size", "2"],
        ["round_robin"],
    ),
    ("spec config json", ["--speculative-config", "{method: eagle3"], ["--speculative-config", "JSON"]),
    ("spec config object", ["--speculative-config", "[1, 2]"], ["--speculative-config", "object"]),
    ("spec config keys", ["--speculative-config", '{"method": "eagle3", "topk": 2}'], ["topk"]),
    ("spec config method", ["--speculative-config", '{"method": "medusa"}'], ["medusa", "eagle3"]),
    (
        "spec config tokens",
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 0}'],
        ["num_speculative_tokens"],
    ),
    ("dflash needs block", DFLASH, ["--speculative-num-draft-tokens"]),
    (
        "dflash step rule",
        [*DFLASH, "--speculative-num-draft-tokens", "6", "--speculative-num-steps", "4"],
        ["--speculative-num-steps", "5"],
    ),
    ("eagle3 layers", ["--eagle3-layers-to-capture", "2,x"], ["--eagle3-layers-to-capture"]),
    (
        "cpu attention",
        ["--device", "cpu", "--attention-backend", "flashinfer"],
        ["--attention-backend", "torch"],
    ),
    (
        "cpu sampling",
        ["--device", "cpu", "--sampling-backend", "flashinfer"],
        ["--sampling-backend", "torch"],
    ),
    ("memory fraction", ["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization"]),
    ("port", ["--port", "70000"], ["--port"]),
    ("chunked zero", ["--chunked-prefill-size", "0"], ["--chunked-prefill-size", "-1"]),
    ("negative tp", ["--tp", "0"], ["--attn-tp-size"]),
    ("cpu kv size", ["--cpu-kv-cache-memory-gb", "0"], ["--cpu-kv-cache-memory-gb"]),
    ("hf overrides", ["--hf-overrides", "not json"], ["--hf-overrides"]),
    ("hf overrides object", ["--hf-overrides", "[1]"], ["--hf-overrides", "object"]),
    ("kv events", ["--kv-events-config", "{"], ["--kv-events-config"]),
    (
        "storage extra config",
        ["--kvstore-storage-backend-extra-config", "3"],
        ["--kvstore-storage-backend-extra-config"],
    ),
    ("base gpu", ["--base-gpu-id", "-1"], ["--base-gpu-id"]),
    ("gpu step", ["--gpu-id-step", "0"], ["--gpu-id-step"]),
]


@pytest.mark.parametrize(("argv", "words"), [r[1:] for r in CLI_ERRORS], ids=[r[0] for r in CLI_ERRORS])
def test_cli_error(argv, words):
    with pytest.raises(ValueError) as info:
        prepare_server_args(["MODEL", *argv], platform=AMPERE)
    for word in words:
        assert word in str(info.value)


def test_cp_with_many_sequences(monkeypatch):
    monkeypatch.setenv("ENABLE_CP", "1")
    with pytest.raises(ValueError, match="--max-num-seqs 1"):
        prepare_server_args(["MODEL", "--tp", "2", "--max-num-seqs", "4"], platform=AMPERE)


# Values the parser's choices would stop, but a profile builds ServerArgs directly.
DIRECT_ERRORS = [
    ({"device": "tpu"}, "--device"),
    ({"attention_backend": "xformers"}, "--attention-backend"),
    ({"metrics_reporters": ["statsd"]}, "--metrics-reporters"),
    ({"load_balance_method": "random"}, "--load-balance-method"),
    ({"speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 2}, "--speculative-eagle-topk 1"),
    ({"enable_kvstore": True, "enable_prefix_caching": False}, "drop enable_kvstore"),
    ({"model": ""}, "model is required"),
    ({"max_num_seqs": 0}, "--max-num-seqs"),
    ({"ep_size": 0}, "--ep-size"),
]


@pytest.mark.parametrize(("fields", "message"), DIRECT_ERRORS)
def test_direct_construction_error(fields, message):
    kwargs = {"model": "m", **fields}
    with pytest.raises(ValueError, match=message):
        ServerArgs(**kwargs, platform=AMPERE)
