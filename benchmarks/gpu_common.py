"""Shared pieces of the GPU benchmarks: model shapes, device ceilings measured in the same run, and
hand-built decode / prefill batches driven straight through the engine's ModelRunner.

The ceilings are measured, not taken from a datasheet: bandwidth from a large device-to-device copy
(bytes read plus bytes written over the time), matmul peak from an 8192^3 bf16 product on random data.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tokenspeed.bench_results import write_results

# The shapes are Hugging Face config.json files (benchmarks/shapes/), so a server can be pointed at them
# too: a folder holding one as config.json serves with `--load-format dummy`.
SHAPES = Path(__file__).resolve().parent / "shapes"
LLAMA_8B: dict[str, Any] = json.loads((SHAPES / "llama-3.1-8b.json").read_text())
QWEN3_30B_A3B: dict[str, Any] = json.loads((SHAPES / "qwen3-30b-a3b.json").read_text())


def write_config(config: dict[str, Any], name: str) -> str:
    """A model folder holding only config.json (weights are `--load-format dummy`)."""
    path = Path(tempfile.mkdtemp(prefix=f"tokenspeed-{name}-"))
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def time_cuda(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median seconds of `fn()` between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), iters=20)
    src = dst = None
    torch.cuda.empty_cache()
    return 2 * nbytes / t


def graph_seconds(calls: list) -> float:
    """Seconds per call of a CUDA graph replaying `calls` in order (each warmed up eagerly first, so an
    autotuner runs outside the capture), as the engine replays decode steps."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    return time_cuda(graph.replay, iters=10, warmup=2) / len(calls)


def cold_copies(make, nbytes: int, cold_bytes: int = 256 << 20) -> list:
    """Enough independent copies of a weight (from `make()`) that cycling them defeats the 50 MB L2 cache,
    as in a real step, where the other layers' weights evict it."""
    return [make() for _ in range(max(2, -(-cold_bytes // nbytes)))]


def matmul_peak(n: int = 8192) -> float:
    """FLOP/s of an n^3 bf16 matrix product on random data."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = time_cuda(lambda: a @ b, iters=10)
    a = b = None
    torch.cuda.empty_cache()
    return 2 * n**3 / t


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def device_info() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / (1 << 30), 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def make_core(model_dir: str, **server_args: Any):
    """An EngineCore (model runner, KV pool, graphs) on dummy bf16 weights, without a tokenizer."""
    from tokenspeed.config.server_args import ServerArgs
    from tokenspeed.runtime.engine.engine_core import EngineCore

    args = dict(load_format="dummy", dtype="bfloat16", device="cuda", skip_tokenizer_init=True)
    args.update(server_args)
    return EngineCore(ServerArgs(model=model_dir, **args))


def expected_active_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Distinct experts a batch touches per layer under uniform routing: E * (1 - (1 - k/E)^B)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def weight_bytes_read(model: torch.nn.Module, active_fraction: float = 1.0) -> int:
    """Bytes of parameters a decode step reads: all of them except the embedding table (a step gathers
    only its batch's rows from it); stacked expert weights (`w13`/`w2`) count only the share of experts
    the step activates."""
    total = 0.0
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen or "embed_tokens" in name:
            continue
        seen.add(id(p))
        share = active_fraction if name.endswith((".w13", ".w2")) else 1.0
        total += p.numel() * p.element_size() * share
    return int(total)


def fill_kv_random(kv_pool) -> None:
    """Random K/V everywhere, so attention reads real-looking data (never time on zeros)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    for layer in range(kv_pool.spec.num_layers):
        for buf in kv_pool.get_kv(layer):
            if buf.element_size() == 1:  # an FP8 cache: uniform_ has no float8 kernel
                buf.copy_(
                    torch.empty(buf.shape, dtype=torch.bfloat16, device=buf.device).uniform_(
                        -1.0, 1.0, generator=gen
                    )
                )
            else:
                buf.uniform_(-1.0, 1.0, generator=gen)


def synthetic_batch(runner, batch_size: int, context: int, new_tokens: int = 1):
    """A ForwardBatch of `batch_size` requests with `context` cached tokens each and `new_tokens` new
    ones, occupying contiguous pages from page 1 on (page 0 is the reserved padding page)."""
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

    pool = runner.kv_pool
    bs_tok = pool.block_size
    seq = context + new_tokens
    span = -(-seq // bs_tok) * bs_tok
    need = batch_size * span + bs_tok
    if need > pool.num_slots:
        raise ValueError(
            f"batch {batch_size} x {seq} tokens needs {need} KV slots; the pool has {pool.num_slots}"
        )
    table = runner.req_to_token.table
    if batch_size > table.shape[0] or seq > table.shape[1]:
        raise ValueError(f"req_to_token is {tuple(table.shape)}; raise --max-num-seqs / --max-model-len")
    dev = table.device
    starts = bs_tok + torch.arange(batch_size, device=dev, dtype=torch.int64) * span
    slots = starts[:, None] + torch.arange(seq, device=dev)[None, :]
    table[:batch_size, :seq] = slots.to(torch.int32)
    positions = torch.arange(context, seq, device=dev).repeat(batch_size)
    out_loc = slots[:, context:].reshape(-1)
    ext = torch.full((batch_size,), new_tokens, dtype=torch.int32, device=dev)
    vocab = runner.model_config.vocab_size
    return ForwardBatch(
        input_ids=torch.randint(0, vocab, (batch_size * new_tokens,), device=dev),
        positions=positions,
        out_cache_loc=out_loc,
        req_pool_indices=torch.arange(batch_size, dtype=torch.int32, device=dev),
        seq_lens=torch.full((batch_size,), seq, dtype=torch.int32, device=dev),
        extend_lens=ext,
        extend_prefix_lens=torch.full((batch_size,), context, dtype=torch.int32, device=dev),
        logits_indices=torch.cumsum(ext, 0).long() - 1,
        req_to_token=table,
        kv_pool=pool,
        attn_backend=runner.attn_backend,
        seq_lens_cpu=[seq] * batch_size,
        extend_lens_cpu=[new_tokens] * batch_size,
        is_decode_only=new_tokens == 1,
    )


def gc_collect_cuda() -> None:
    """Free a finished engine's GPU memory: its runner, graphs and backend reference each other, so
    only the cycle collector releases the KV pool before the next engine is built."""
    import gc

    gc.collect()
    torch.cuda.empty_cache()


def save_json(path: str, data: dict[str, Any]) -> None:
    """Write a results file with its provenance (`tokenspeed/bench_results.py`): results are the scripts'
    own output, never edited by hand; what a reader needs to know is in the script's fields."""
    write_results(path, data)


def save_run(path: str, benchmark: str, model: str, **fields: Any) -> None:
    """`save_json` for a run of one model on this GPU: the benchmark, the model, the device, then `fields`."""
    save_json(path, dict(benchmark=benchmark, model=model, device=device_info(), **fields))
