"""CUDA graphs for decode steps.

A decode step of a small batch is dominated by launch overhead (hundreds of small kernels), so the
runner captures the whole model forward once per batch size and replays it. Capture sizes come from
`--cudagraph-capture-sizes`, or a ladder (1, 2, 4, then every 8) up to `--max-cudagraph-capture-size`
(`memory_model.capture_sizes`, the ladder the console's planner puts on a server's command line).
A batch between two sizes is padded up to the next one (rows of padding read one token through table
row 0 and write to slot 0, the pool's reserved padding page) unless `--disable-cuda-graph-padding`,
in which case only exact sizes replay. `--enforce-eager` turns graphs off.

All graphs share one memory pool, captured largest first so smaller graphs reuse its blocks; the pool's
size is estimated before the KV cache is sized (`memory_model.held_back_bytes`) and measured after capture.

Speculative decoding replays the same graphs. A verify step (each request's last token and its k drafts)
is laid out as a decode of its tokens, one row per token (`verify_graph_sizes` adds token counts b*(k+1)),
and an EAGLE3 draft's one-layer forwards use a runner of their own (speculative/draft_graphs.py). With
`aux_layers` the captured forward also stores the target states an EAGLE3 draft reads, in graph memory
that each replay refills. Whatever a replay returns is overwritten by the next replay of the runner.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenspeed.config import memory_model
from tokenspeed.config.slices import GraphConfig
from tokenspeed.runtime.execution.forward_batch import AuxCapture, ForwardBatch
from tokenspeed.runtime.startup_progress import Progress

logger = logging.getLogger(__name__)

_MIB = 1 << 20


@contextlib.contextmanager
def hold_memory(nbytes: int, device: torch.device) -> Iterator[None]:
    """Keep `nbytes` of GPU memory taken while the KV pool is sized, then give it back for the graphs."""
    if device.type != "cuda" or nbytes <= 0:
        yield
        return
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        yield
    finally:
        del block
        torch.cuda.empty_cache()


@dataclass
class _Static:
    """The captured graphs' input tensors; replay copies each step's batch into their first rows."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    ones: torch.Tensor
    prefix_lens: torch.Tensor
    logits_indices: torch.Tensor
    outputs: dict[int, Any] = field(default_factory=dict)  # size -> a tensor or a tuple of tensors
    aux: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # size -> layer -> [size, H]

    @classmethod
    def allocate(cls, max_bs: int, device: torch.device) -> _Static:
        def z(dtype):
            return torch.zeros(max_bs, dtype=dtype, device=device)

        return cls(
            input_ids=z(torch.int64),
            positions=z(torch.int64),
            out_cache_loc=z(torch.int64),
            req_pool_indices=z(torch.int32),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=device),
            ones=torch.ones(max_bs, dtype=torch.int32, device=device),
            prefix_lens=z(torch.int32),
            logits_indices=torch.arange(max_bs, dtype=torch.int64, device=device),
        )


class GraphCaptureUnsupported(RuntimeError):
    """The model's decode forward synchronizes with the host, so it cannot run from a CUDA graph."""


@dataclass
class GraphUse:
    """How a runner's forwards ran since it started (read by tests and benchmarks, never by the engine)."""

    decode_replays: int = 0
    verify_replays: int = 0  # verify steps (drafted batches) replayed from a graph
    verify_eager: int = 0  # verify steps run eagerly (no graph fits, a prefill chunk, graphs off)
    draft_replays: int = 0  # EAGLE3 draft forwards replayed from a graph
    draft_eager: int = 0


class EagerOnce:
    """Logs each distinct reason for an eager forward once, so a server says why without flooding."""

    def __init__(self, log: logging.Logger = logger):
        self.log = log
        self.seen: set[str] = set()

    def __call__(self, reason: str) -> None:
        if reason not in self.seen:
            self.seen.add(reason)
            self.log.info("running eagerly: %s", reason)


class CudaGraphRunner:
    """Captures `forward(fb) -> [bs, vocab]` for decode batch sizes and replays it."""

    def __init__(
        self,
        forward: Callable[[ForwardBatch], torch.Tensor],
        attn_backend: Any,
        kv_pool: Any,
        req_to_token: torch.Tensor,
        device: torch.device,
        sizes: list[int],
        max_context_len: int,
        pad: bool = True,
        enable_gc: bool = False,
        aux_layers: tuple[int, ...] | None = None,
        inputs: dict[str, torch.Tensor] | None = None,
        label: str = "decode",
    ):
        """`aux_layers`: target layers whose states each replay stores (EAGLE3); `inputs`: static buffers
        [max(sizes), ...] that `forward` reads (sliced to the batch) besides the batch, filled by `replay`."""
        if not getattr(attn_backend, "supports_cuda_graph", False):
            raise ValueError(
                f"attention backend {type(attn_backend).__name__} cannot be captured in CUDA graphs; "
                "choose --attention-backend triton or flashinfer, or pass --enforce-eager"
            )
        self.forward = forward
        self.attn_backend = attn_backend
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.device = device
        self.sizes = sorted(sizes)
        self.max_bs = self.sizes[-1]
        self.pad = pad
        self.enable_gc = enable_gc
        self.aux_layers = aux_layers
        self.inputs = inputs or {}
        self.label = label
        self.static = _Static.allocate(self.max_bs, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.capture_seconds = 0.0
        self.memory_bytes = 0
        attn_backend.init_cuda_graph_state(self.max_bs, max_context_len)

    def _batch(self, bs: int, seq_lens_cpu: list[int]) -> ForwardBatch:
        s = self.static
        return ForwardBatch(
            input_ids=s.input_ids[:bs],
            positions=s.positions[:bs],
            out_cache_loc=s.out_cache_loc[:bs],
            req_pool_indices=s.req_pool_indices[:bs],
            seq_lens=s.seq_lens[:bs],
            extend_lens=s.ones[:bs],
            extend_prefix_lens=s.prefix_lens[:bs],
            logits_indices=s.logits_indices[:bs],
            req_to_token=self.req_to_token,
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
            seq_lens_cpu=seq_lens_cpu,
            extend_lens_cpu=[1] * bs,
            is_decode_only=True,
            aux_capture=AuxCapture(self.aux_layers) if self.aux_layers else None,
        )

    def capture(self, progress: bool = True) -> None:
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        stream = torch.cuda.Stream(self.device)
        sizes = list(reversed(self.sizes))
        # n/m on a terminal (redrawn) and in logs (a line every few seconds): capture can take minutes.
        bar = Progress("CUDA graphs captured", len(sizes), logger, unit="items") if progress else None
        freeze = not self.enable_gc
        if freeze:
            # Garbage collection during capture only slows it down: nothing captured is garbage.
            gc.collect()
            gc.freeze()
        try:
            with torch.cuda.stream(stream):
                for bs in sizes:
                    self._capture_one(bs, stream)
                    if bar is not None:
                        bar.advance(1)
        finally:
            if bar is not None:
                bar.finish()
            if freeze:
                gc.unfreeze()
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        self.memory_bytes = max(0, free_before - torch.cuda.mem_get_info(self.device)[0])
        logger.info(
            "Captured %d %s CUDA graphs (batch sizes %s) in %.1f s, using %.0f MiB",
            len(sizes),
            self.label,
            _ranges(self.sizes),
            self.capture_seconds,
            self.memory_bytes / _MIB,
        )

    def _capture_one(self, bs: int, stream: torch.cuda.Stream) -> None:
        fb = self._batch(bs, [1] * bs)
        # Warm-up outside the graph: compiles kernels and lets backends allocate their scratch. The second
        # run fails fast if the forward waits on the device (e.g. a loop over `unique(ids).tolist()`),
        # which a graph cannot capture; checked eagerly, the capture never starts in a broken state.
        self.attn_backend.init_forward_metadata(fb)
        self.forward(fb)
        stream.synchronize()
        self.attn_backend.init_forward_metadata(fb)
        torch.cuda.set_sync_debug_mode("error")
        try:
            self.forward(fb)
        except RuntimeError as e:
            raise GraphCaptureUnsupported(str(e).splitlines()[0]) from e
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream.synchronize()
        self.attn_backend.init_forward_metadata_capture(fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = self.forward(fb)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.static.outputs[bs] = out
        if fb.aux_capture is not None:
            missing = [i for i in fb.aux_capture.layer_ids if i not in fb.aux_capture.states]
            if missing:
                raise GraphCaptureUnsupported(f"the model stored no states for captured layers {missing}")
            self.static.aux[bs] = dict(fb.aux_capture.states)

    def padded_size(self, bs: int) -> int | None:
        i = bisect.bisect_left(self.sizes, bs)
        if i == len(self.sizes):
            return None
        size = self.sizes[i]
        return size if (self.pad or size == bs) else None

    def can_run(self, fb: ForwardBatch) -> bool:
        # a batch keeping extra logits rows (prompt logprobs) is never decode-only; checked all the same,
        # since a graph returns one row per request
        # (a graph holds the states of its own aux layers only)
        return (
            fb.is_decode_only
            and fb.logits_indices.shape[0] == fb.batch_size
            and self.padded_size(fb.batch_size) is not None
            and (fb.aux_capture is None or fb.aux_capture.layer_ids == self.aux_layers)
        )

    def replay(self, fb: ForwardBatch, **inputs: torch.Tensor) -> Any:
        """The captured forward's output for `fb`, its rows cut to the batch; `inputs` fill the static
        buffers of the same names. `fb.aux_capture`, if set, receives views of the stored states."""
        bs = fb.batch_size
        size = self.padded_size(bs)
        s = self.static
        s.input_ids[:bs].copy_(fb.input_ids)
        s.positions[:bs].copy_(fb.positions)
        s.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        s.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        s.seq_lens[:bs].copy_(fb.seq_lens)
        seq_lens_cpu = list(fb.seq_lens_cpu or fb.seq_lens.tolist())
        if size > bs:
            # Padding rows: one token of table row 0, written to the reserved slot 0.
            s.input_ids[bs:size].zero_()
            s.positions[bs:size].zero_()
            s.out_cache_loc[bs:size].zero_()
            s.req_pool_indices[bs:size].zero_()
            s.seq_lens[bs:size].fill_(1)
            seq_lens_cpu += [1] * (size - bs)
        for name, value in inputs.items():
            self.inputs[name][:bs].copy_(value)  # padding rows keep finite values of earlier steps
        self.attn_backend.init_forward_metadata_replay(self._batch(size, seq_lens_cpu))
        self.graphs[size].replay()
        if fb.aux_capture is not None:
            fb.aux_capture.states.update({i: t[:bs] for i, t in s.aux[size].items()})
        out = s.outputs[size]
        return tuple(o[:bs] for o in out) if isinstance(out, tuple) else out[:bs]


def _ranges(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}..{sizes[-1]} ({len(sizes)} sizes)"


def decode_graph_sizes(graphs: GraphConfig, device: torch.device, attention_backend: str, max_num_reqs: int):
    """Capture sizes for this run, or None when decode runs eagerly (CPU, --enforce-eager, or a backend
    that cannot be captured, which is logged rather than failed: eager decode is still correct)."""
    if device.type != "cuda":
        return None
    if attention_backend == "torch" and not graphs.enforce_eager:
        logger.info("CUDA graphs are off: --attention-backend torch plans on the host every step")
    sizes = None if graphs.capture_sizes is None else list(graphs.capture_sizes)
    return memory_model.graph_capture_sizes(
        graphs.enforce_eager, attention_backend, sizes, graphs.max_capture_size, max_num_reqs
    )


def verify_graph_sizes(sizes: list[int] | None, tokens_per_req: int) -> list[int] | None:
    """`sizes` plus the token counts of verify steps, b * tokens_per_req for each captured batch size b,
    up to the largest decode size (or one request's tokens, whichever is more): verify graphs then
    need no more graph memory than decode's largest, and a server of few requests still verifies in a
    graph. Larger verify steps are padded to the next size or run eagerly."""
    if not sizes or tokens_per_req <= 1:
        return sizes
    top = max(max(sizes), tokens_per_req)
    return sorted(set(sizes) | {b * tokens_per_req for b in sizes if b * tokens_per_req <= top})


def decode_graph_reserve(model_config: Any, sizes: list[int] | None, attention_backend: str) -> int:
    """GPU bytes to hold back while sizing the KV pool: the graph pool, plus FlashInfer's workspace,
    which the backend allocates after the pool."""
    return memory_model.held_back_bytes(
        sizes,
        attention_backend,
        model_config.hidden_size,
        model_config.intermediate_size,
        model_config.vocab_size,
        torch.empty((), dtype=model_config.dtype).element_size(),
    )


def build_graph_runner(
    forward: Callable[[ForwardBatch], torch.Tensor],
    attn_backend: Any,
    kv_pool: Any,
    req_to_token: torch.Tensor,
    device: torch.device,
    sizes: list[int] | None,
    graphs: GraphConfig,
    max_context_len: int,
    aux_layers: tuple[int, ...] | None = None,
) -> CudaGraphRunner | None:
    if not sizes:
        return None
    runner = CudaGraphRunner(
        forward,
        attn_backend,
        kv_pool,
        req_to_token,
        device,
        sizes,
        max_context_len,
        pad=graphs.pad,
        enable_gc=graphs.enable_gc,
        aux_layers=aux_layers,
    )
    try:
        with torch.inference_mode():
            runner.capture()
    except GraphCaptureUnsupported as e:
        logger.warning(
            "CUDA graphs are off: the model's decode step waits on the device (%s); decoding eagerly",
            e,
        )
        runner.graphs.clear()
        torch.cuda.empty_cache()
        return None
    return runner
