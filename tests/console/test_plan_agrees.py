"""The planner's KV tokens are the server's: for GPU readings (one H200, two with another job on one, eight
with a MoE model, one L4), the plan of a profile equals what the server's own sizing code decides.

The server side is the server's code, not the memory model's formulas again: the command line the
supervisor spawns (the profile plus the plan's flags) resolved by `tokenspeed serve`'s parser, the real
model built on the meta device and sharded for rank 0 (its parameter and buffer bytes), the KV pool spec
and request table of the model runner, its CUDA-graph sizes and reserve, and `kv_sizing` run on each rank's
GPU as NVML reported it, less what the rank holds by then. The one figure both sides assume is the CUDA
context (`memory_model.CUDA_CONTEXT_BYTES`), which tests/gpu/test_plan_gpu.py checks on an H200.

h200x8-idle.json is a recorded reading; h200x2-others.json (GPU 1 with another job's 30 GiB) and
l4x1-idle.json are built from NVML's fields in the same form.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from console.probe import load_probe
from console.profile.fleet import load_and_resolve
from console.profile.plan import plan_with_platform, platform_facts
from tokenspeed.config import memory_model
from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.slices import ExpertPlan, GraphConfig
from tokenspeed.runtime.cache.kv_pool import KVPoolSpec, kv_storage_dtype
from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable
from tokenspeed.runtime.distributed.groups import ParallelGroups, RankGroup
from tokenspeed.runtime.distributed.mapping import GROUP_KINDS
from tokenspeed.runtime.distributed.tensor_parallel import apply_parallelism, local_kv_heads
from tokenspeed.runtime.execution import cuda_graph
from tokenspeed.runtime.execution.kv_sizing import gpu_num_pages
from tokenspeed.runtime.layers.attention.backend import default_attention_backend
from tokenspeed.runtime.layers.quantization import fp8
from tokenspeed.runtime.models.loader import build_model
from tokenspeed.runtime.models.model_config import ModelConfig

DATA = Path(__file__).resolve().parent / "data"
SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"  # the models' config.json files
MIB = 1 << 20

CASES = {
    # name: (config, reading, [server] lines, [fleet] gpus)
    "llama8b-1xH200-flashinfer": (
        "llama-3.1-8b.json",
        "h200x8-idle.json",
        'dtype = "bfloat16"\nmax_model_len = 32768\nattention_backend = "flashinfer"',
        [0],
    ),
    "llama8b-tp2-other-job-on-gpu1": (
        "llama-3.1-8b.json",
        "h200x2-others.json",
        "attn_tp_size = 2",
        [0, 1],
    ),
    "qwen3moe-8xH200-attention-dp": (
        "qwen3-30b-a3b.json",
        "h200x8-idle.json",
        "max_model_len = 32768\ndata_parallel_size = 8\nenable_expert_parallel = true",
        list(range(8)),
    ),
    "qwen3moe-tp2-ep2-other-job": (
        "qwen3-30b-a3b.json",
        "h200x2-others.json",
        "attn_tp_size = 2\nep_size = 2\nmax_model_len = 16384",
        [0, 1],
    ),
    # FP8 weights quantized at load (one byte a weight) and an FP8 KV cache (one byte an element)
    "llama8b-1xH200-fp8-weights-fp8-kv": (
        "llama-3.1-8b.json",
        "h200x8-idle.json",
        'dtype = "bfloat16"\nmax_model_len = 32768\nquantization = "fp8"\nkv_cache_dtype = "fp8_e4m3"',
        [0],
    ),
    "llama8b-1xL4-small-graphs": ("llama-3.1-8b.json", "l4x1-idle.json", "max_model_len = 4096", [0]),
}


def _profile(tmp_path: Path, config: str, server: str, gpus: list[int]) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((SHAPES / config).read_text())
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[server]\nmodel = "{model}"\n'
        + server
        + textwrap.dedent(f"""
            [fleet]
            name = "agree"
            gpus = {json.dumps(gpus)}
            """)
    )
    return path


def _rank0_groups(mapping) -> ParallelGroups:
    """Rank 0's groups as `build_groups` lays them out (no communicators: nothing is sent here)."""
    world = RankGroup("world", tuple(range(mapping.world_size)), 0)
    kinds = {kind: RankGroup(kind, tuple(mapping.group_of(kind, 0)), 0) for kind in GROUP_KINDS}
    return ParallelGroups(mapping=mapping, rank=0, world=world, by_kind=kinds)


def server_kv_tokens(argv: list[str], gpu_free: list[tuple[int, int]], facts) -> tuple[int, dict]:
    """What `tokenspeed serve argv` sizes its KV pool to on GPUs with (free, total) bytes before start."""
    args = prepare_server_args(argv, platform=facts)
    config = ModelConfig.from_pretrained(
        args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        device=args.device,
        quantization=args.quantization,
    )
    groups = _rank0_groups(args.mapping)
    model = build_model(
        config, "meta", lambda m: apply_parallelism(m, groups, ExpertPlan.from_server_args(args))
    )
    if config.weight_quant is not None:
        fp8.quantize_model(model)  # what the loader does after reading an unquantized checkpoint
    held_by_model = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    spec = KVPoolSpec(
        num_layers=config.num_layers,
        num_kv_heads=local_kv_heads(config.num_kv_heads, args.mapping.attn_tp_size),
        head_dim=config.head_dim,
        dtype=kv_storage_dtype(args.kv_cache_dtype, config.dtype),
        block_size=args.block_size,
    )
    table = ReqToTokenTable(args.max_num_seqs, config.max_model_len, args.block_size, "meta").table
    attention = args.attention_backend or default_attention_backend("cuda", config.dtype)
    sizes = cuda_graph.decode_graph_sizes(
        GraphConfig.from_server_args(args), torch.device("cuda"), attention, args.max_num_seqs
    )
    held = cuda_graph.decode_graph_reserve(config, sizes, attention)
    pages = []
    for free, total in gpu_free:
        at_sizing = free - memory_model.CUDA_CONTEXT_BYTES - held_by_model - table.numel() * 4 - held
        pages.append(gpu_num_pages(spec, at_sizing, total, args.gpu_memory_utilization))
    resolved = {
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "capture_sizes": sizes,
        "model_bytes": held_by_model,
    }
    return (min(pages) - 1) * args.block_size, resolved  # ranks agree on the smallest pool


@pytest.mark.parametrize("case", list(CASES))
def test_plan_equals_the_servers_sizing(case, tmp_path):
    config, reading, server, gpus = CASES[case]
    probe = load_probe(DATA / reading)
    resolved = load_and_resolve(_profile(tmp_path, config, server, gpus))
    plan = plan_with_platform(resolved, probe)
    assert plan.fits, plan.reason
    readings = probe.by_index()
    for spec in resolved.servers:
        planned = plan.server(spec.name)
        argv = [*spec.processes[0].argv, *planned.planned_flags]
        gpu_free = [(int(readings[g].free_mib * MIB), int(readings[g].total_mib * MIB)) for g in spec.gpus]
        tokens, served = server_kv_tokens(argv, gpu_free, platform_facts(probe))
        # The plan's flags reach the server: the same fraction and CUDA-graph sizes.
        assert served["gpu_memory_utilization"] == planned.gpu_memory_utilization
        assert served["capture_sizes"] == (planned.cudagraph_capture_sizes or None)
        assert planned.weights_gib * (1 << 30) == pytest.approx(served["model_bytes"], rel=0.002)
        assert planned.kv_tokens == pytest.approx(tokens, rel=0.002), (planned.kv_tokens, tokens)


def test_fp8_kv_cache_plans_twice_the_tokens(tmp_path):
    """The same server with --kv-cache-dtype fp8_e4m3: half the bytes a token, twice the KV tokens."""
    probe = load_probe(DATA / "h200x8-idle.json")
    tokens = {}
    for kv in ("auto", "fp8_e4m3"):
        server = f'dtype = "bfloat16"\nmax_model_len = 32768\nkv_cache_dtype = "{kv}"'
        (tmp_path / kv).mkdir()
        resolved = load_and_resolve(_profile(tmp_path / kv, "llama-3.1-8b.json", server, [0]))
        planned = plan_with_platform(resolved, probe).server(resolved.servers[0].name)
        tokens[kv] = (planned.kv_tokens, planned.kv_bytes_per_token)
    assert tokens["fp8_e4m3"][1] * 2 == tokens["auto"][1] == 131072  # 32 layers x 8 heads x 128 x K,V
    assert tokens["fp8_e4m3"][0] == pytest.approx(2 * tokens["auto"][0], rel=1e-4)
