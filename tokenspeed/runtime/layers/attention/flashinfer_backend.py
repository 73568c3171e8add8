"""`--attention-backend flashinfer`: FlashInfer's wrappers over our paged KV pool, used the way FlashInfer
is meant to be used.

- FlashInfer's page is our KV page (page_size = --block-size): the pool's per-layer buffers viewed as
  `[num_pages, block_size, kv_heads, head_dim]` are its NHD layout, so no K/V is ever copied.
- Decode: `BatchDecodeWithPagedKVCacheWrapper`, with tensor cores when a KV head serves >= 4 query heads
  (GQA: the query heads of a group become rows of one MMA tile). The tensor-core path is FlashInfer's FA2
  prefill kernel with split-KV, named explicitly: left on "auto", Hopper would pick FA3, whose scheduler
  gives every query head its own 128-row tile and never splits the KV (measured at 22-39% of the bandwidth
  limit on an H200 against 64-73% for our Triton kernel).
- Prefill: a batch with no cached prefix attends over its own new K/V through the ragged wrapper (the new
  tokens' K/V are read from the layer's activations, not back from the pool); chunks over a cached prefix
  and mixed batches go through the paged prefill wrapper. Both causal, which FlashInfer aligns to the end
  of each request's keys, the "new token i sees prefix + i" rule. FA2 as well, so one JIT module serves
  decode and prefill (one compile, one cache entry); at 8B sizes attention is a few percent of prefill.
- Planning happens once per step, outside any CUDA graph, in `init_forward_metadata`; every layer then
  only runs. Graphs: one decode wrapper per captured batch size (FlashInfer fixes the batch size of a
  graph wrapper) over shared device buffers that the captured kernels read; a replay writes the page list
  into those buffers on the device and re-plans on the host from the step's host-side lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tokenspeed.runtime.kernels.kv_store import store_kv_into_pool
from tokenspeed.runtime.kernels.page_indices import build_page_indices
from tokenspeed.runtime.layers.attention.backend import AttentionBackend

if TYPE_CHECKING:
    from tokenspeed.runtime.cache.kv_pool import KVPool
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

WORKSPACE_BYTES = 256 * 1024 * 1024
# FlashInfer's own guidance: tensor-core decode pays off from 4 query heads per KV head (fp16/bf16).
TENSOR_CORE_MIN_GROUP = 4
KERNEL_BACKEND = "fa2"

RAGGED, PAGED, DECODE = "ragged", "paged", "decode"


@dataclass
class _Plan:
    wrapper: Any
    kind: str


@dataclass
class _PageTable:
    """One step's FlashInfer page table: host indptr / last-page lengths for the plan, device page list."""

    indptr: torch.Tensor  # [B + 1] int32, host
    indices: torch.Tensor  # [pages] int32, device
    last_page_len: torch.Tensor  # [B] int32, host


def _num_q_heads(model_config: Any) -> int | None:
    for obj in (model_config, getattr(model_config, "hf_config", None)):
        if obj is None:
            continue
        for name in ("num_attention_heads_per_rank", "num_heads", "num_attention_heads"):
            val = getattr(obj, name, None)
            if isinstance(val, int):
                return val
    return None


def _cumsum(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


class FlashInferAttentionBackend(AttentionBackend):
    supports_cuda_graph = True
    supports_fused_rope_store = True

    def __init__(
        self, model_config: Any = None, kv_pool: KVPool | None = None, device: Any = "cuda", **_: Any
    ):
        try:
            import flashinfer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ValueError(
                "--attention-backend flashinfer needs the flashinfer-python package; install it or choose "
                "--attention-backend triton"
            ) from exc
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError("--attention-backend flashinfer needs a CUDA GPU; use --attention-backend torch")
        if kv_pool is None:
            raise ValueError("the flashinfer backend needs the KV pool")
        if kv_pool.spec.dtype not in (torch.float16, torch.bfloat16) and not kv_pool.quantized:
            raise ValueError(
                f"--attention-backend flashinfer supports bfloat16/float16 KV caches, not {kv_pool.spec.dtype}; "
                "use --dtype bfloat16 or --attention-backend triton"
            )
        self.fi = flashinfer
        self.kv_pool = kv_pool
        spec = kv_pool.spec
        self.page_size = spec.block_size
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        # q in the model's dtype; an FP8 pool is planned with kv_data_type float8
        # and read with its per-tensor k_scale / v_scale.
        self.kv_dtype = spec.dtype
        self.dtype = getattr(model_config, "dtype", spec.dtype) if kv_pool.quantized else spec.dtype
        self.num_heads = _num_q_heads(model_config)
        self.sm_scale = 1.0 / math.sqrt(self.head_dim)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.ragged_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend=KERNEL_BACKEND
        )
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=KERNEL_BACKEND
        )
        self._decode_wrapper: Any = None
        self._indices = torch.empty(0, dtype=torch.int32, device=self.device)
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_bufs: dict[str, torch.Tensor] = {}
        self.plan: _Plan | None = None

    # -- helpers -----------------------------------------------------------------------------------

    def _heads_or_fail(self) -> int:
        if self.num_heads is None:
            raise ValueError(
                "the flashinfer backend could not read the number of attention heads from the model config"
            )
        return self.num_heads

    def use_tensor_cores(self) -> bool:
        return self._heads_or_fail() // self.num_kv_heads >= TENSOR_CORE_MIN_GROUP

    def _new_decode_wrapper(self, **graph_buffers: Any):
        tc = self.use_tensor_cores()
        # The CUDA-core decode kernel has no backend choice; the tensor-core one is pinned to FA2 (see above).
        extra = {"backend": KERNEL_BACKEND} if tc else {}
        return self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=tc, **graph_buffers, **extra
        )

    def _page_table(self, fb: ForwardBatch, out: torch.Tensor | None = None) -> _PageTable:
        """Host indptr/last-page lengths from the step's host lengths; the page list built on the device."""
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        ps = self.page_size
        pages = [(s + ps - 1) // ps for s in seq_lens]
        indptr = _cumsum(pages)
        total = indptr[-1]
        if out is None:
            if self._indices.numel() < total:
                self._indices = torch.empty(
                    max(total, 2 * self._indices.numel()), dtype=torch.int32, device=self.device
                )
            out = self._indices
        elif out.numel() < total:
            raise ValueError(
                f"a captured decode batch needs {total} KV pages, more than the {out.numel()} sized for "
                "--cuda-graph max context; raise the context bound or use --enforce-eager"
            )
        # Pageable on purpose: a copy from pageable memory is staged when it is issued, so the next step may
        # build its table while this one's copy still waits behind the device's queue.
        indptr_host = torch.tensor(indptr, dtype=torch.int32)
        last = torch.tensor(
            [s - (n - 1) * ps for s, n in zip(seq_lens, pages, strict=True)], dtype=torch.int32
        )
        build_page_indices(
            fb.req_to_token, fb.req_pool_indices, fb.seq_lens,
            indptr_host.to(self.device, non_blocking=True), out, ps,
        )  # fmt: skip
        return _PageTable(indptr_host, out[:total], last)

    def _plan_decode(self, wrapper, fb: ForwardBatch, out: torch.Tensor | None = None) -> None:
        table = self._page_table(fb, out)
        # A graph wrapper copies `indices` into its own buffer, which is `out` already: hand it an empty
        # slice so the plan issues no copy of the buffer onto itself.
        indices = table.indices[:0] if out is not None else table.indices
        wrapper.plan(
            table.indptr,
            indices,
            table.last_page_len,
            self._heads_or_fail(),
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.kv_dtype,
            sm_scale=self.sm_scale,
        )

    # -- planning ----------------------------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        num_heads = self._heads_or_fail()
        if fb.is_decode_only:
            if self._decode_wrapper is None:
                self._decode_wrapper = self._new_decode_wrapper()
            self._plan_decode(self._decode_wrapper, fb)
            self.plan = _Plan(self._decode_wrapper, DECODE)
            return
        ext = fb.extend_lens_cpu or fb.extend_lens.tolist()
        seq = fb.seq_lens_cpu or fb.seq_lens.tolist()
        qo_indptr = torch.tensor(_cumsum(ext), dtype=torch.int32)
        common = dict(causal=True, sm_scale=self.sm_scale, q_data_type=self.dtype, kv_data_type=self.kv_dtype)
        if all(s == e for s, e in zip(seq, ext, strict=True)):
            # Fresh prompts only: each attends over its own new tokens, which are the layer's k/v.
            # (the new k/v are passed as computed, in q's dtype, whatever the pool stores)
            self.ragged_wrapper.plan(
                qo_indptr, qo_indptr, num_heads, self.num_kv_heads, self.head_dim,
                **dict(common, kv_data_type=self.dtype),
            )  # fmt: skip
            self.plan = _Plan(self.ragged_wrapper, RAGGED)
            return
        table = self._page_table(fb)
        self.prefill_wrapper.plan(
            qo_indptr,
            table.indptr,
            table.indices,
            table.last_page_len,
            num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            **common,
        )
        self.plan = _Plan(self.prefill_wrapper, PAGED)

    # -- CUDA graphs -------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        max_pages = max_bs * ((max_context_len + self.page_size - 1) // self.page_size)
        self._graph_bufs = {
            "indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            "indices": torch.zeros(max_pages, dtype=torch.int32, device=self.device),
            "last": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
        }

    def init_forward_metadata_capture(self, fb: ForwardBatch) -> None:
        if not fb.is_decode_only:
            raise ValueError("the flashinfer backend captures decode batches only")
        bs = fb.batch_size
        b = self._graph_bufs
        wrapper = self._new_decode_wrapper(
            use_cuda_graph=True,
            paged_kv_indptr_buffer=b["indptr"][: bs + 1],
            paged_kv_indices_buffer=b["indices"],
            paged_kv_last_page_len_buffer=b["last"][:bs],
        )
        self._graph_wrappers[bs] = wrapper
        self._plan_decode(wrapper, fb, out=b["indices"])
        self.plan = _Plan(wrapper, DECODE)

    def init_forward_metadata_replay(self, fb: ForwardBatch) -> None:
        # The page list is written straight into the buffer the captured kernels read; indptr and the
        # last-page lengths are copied in by the plan.
        wrapper = self._graph_wrappers[fb.batch_size]
        self._plan_decode(wrapper, fb, out=self._graph_bufs["indices"])
        self.plan = _Plan(wrapper, DECODE)

    # -- attention ---------------------------------------------------------------------------------

    def store_new_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> None:
        store_kv_into_pool(fb.kv_pool, layer_id, fb.out_cache_loc, k, v)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch, scale: float
    ) -> torch.Tensor:
        if q.dtype != self.dtype:
            q = q.to(self.dtype)
        if abs(scale - self.sm_scale) > 1e-12 * self.sm_scale:
            # The plan fixed sm_scale for every layer; a model with another scale folds the ratio into q.
            q = q * (scale / self.sm_scale)
        if not q.is_contiguous():
            q = q.contiguous()
        plan = self.plan
        if plan.kind == RAGGED:
            return plan.wrapper.run(q, k.to(self.dtype).contiguous(), v.to(self.dtype).contiguous())
        pool = fb.kv_pool
        if pool.quantized:
            scales = dict(k_scale=pool.k_scales[layer_id], v_scale=pool.v_scales[layer_id])
            return plan.wrapper.run(q, pool.paged_view(layer_id), **scales)
        return plan.wrapper.run(q, pool.paged_view(layer_id))
