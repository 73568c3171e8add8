"""`--attention-backend flashinfer`: FlashInfer's paged prefill and decode wrappers over our KV pool.

FlashInfer's page is our KV page (page_size = --block-size), and the pool's per-layer buffers viewed as
`[num_pages, block_size, kv_heads, head_dim]` are its NHD layout, so no K/V is copied. The wrapper is
planned once per step (page list, split plan) in `init_forward_metadata`; every layer then only runs.

Decode batches use the decode wrapper (tensor-core variant for GQA groups >= 4, where it is faster);
batches with any prefill chunk use the paged prefill wrapper with a causal mask, which FlashInfer aligns
to the end of each request's keys, the "new token i sees prefix + i" rule. CUDA graphs: one decode wrapper
per captured batch size over shared fixed buffers; replay re-plans outside the graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tokenspeed.runtime.kernels.kv_store import store_kv
from tokenspeed.runtime.kernels.page_indices import build_page_indices
from tokenspeed.runtime.layers.attention_backend import AttentionBackend

if TYPE_CHECKING:
    from tokenspeed.runtime.cache.kv_pool import KVPool
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class _Plan:
    wrapper: Any
    decode: bool


def _num_q_heads(model_config: Any, kv_pool: KVPool) -> int | None:
    for obj in (model_config, getattr(model_config, "hf_config", None)):
        if obj is None:
            continue
        for name in ("num_attention_heads_per_rank", "num_heads", "num_attention_heads"):
            val = getattr(obj, name, None)
            if isinstance(val, int):
                return val
    return None


class FlashInferAttentionBackend(AttentionBackend):
    supports_cuda_graph = True

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
        if kv_pool.spec.dtype not in (torch.float16, torch.bfloat16):
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
        self.dtype = spec.dtype
        self.num_heads = _num_q_heads(model_config, kv_pool)
        self.sm_scale = 1.0 / math.sqrt(self.head_dim)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self._decode_wrappers: dict[bool, Any] = {}
        self._indices = torch.empty(0, dtype=torch.int32, device=self.device)
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_bufs: dict[str, torch.Tensor] = {}
        self.plan: _Plan | None = None

    def _tensor_cores(self, num_heads: int) -> bool:
        return num_heads // self.num_kv_heads >= 4

    def _decode_wrapper(self, num_heads: int):
        tc = self._tensor_cores(num_heads)
        if tc not in self._decode_wrappers:
            self._decode_wrappers[tc] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=tc
            )
        return self._decode_wrappers[tc]

    # -- planning ----------------------------------------------------------------------------------

    def _page_table(self, fb: ForwardBatch, out: torch.Tensor | None = None):
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        ps = self.page_size
        pages = [(s + ps - 1) // ps for s in seq_lens]
        indptr = [0]
        for n in pages:
            indptr.append(indptr[-1] + n)
        indptr_host = torch.tensor(indptr, dtype=torch.int32)
        last = torch.tensor(
            [s - (n - 1) * ps for s, n in zip(seq_lens, pages, strict=True)], dtype=torch.int32
        )
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
        indptr_dev = indptr_host.to(self.device, non_blocking=True)
        build_page_indices(fb.req_to_token, fb.req_pool_indices, fb.seq_lens, indptr_dev, out, ps)
        return indptr_host, out[:total], last

    def _plan_decode(
        self, wrapper, fb: ForwardBatch, num_heads: int, out: torch.Tensor | None = None
    ) -> None:
        indptr, indices, last = self._page_table(fb, out)
        wrapper.plan(
            indptr,
            indices,
            last,
            num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            sm_scale=self.sm_scale,
        )

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        num_heads = self._heads_or_fail()
        if fb.is_decode_only:
            wrapper = self._decode_wrapper(num_heads)
            self._plan_decode(wrapper, fb, num_heads)
            self.plan = _Plan(wrapper, decode=True)
            return
        ext = fb.extend_lens_cpu or fb.extend_lens.tolist()
        qo = [0]
        for e in ext:
            qo.append(qo[-1] + e)
        indptr, indices, last = self._page_table(fb)
        self.prefill_wrapper.plan(
            torch.tensor(qo, dtype=torch.int32),
            indptr,
            indices,
            last,
            num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self.plan = _Plan(self.prefill_wrapper, decode=False)

    def _heads_or_fail(self) -> int:
        if self.num_heads is None:
            raise ValueError(
                "the flashinfer backend could not read the number of attention heads from the model config"
            )
        return self.num_heads

    # -- CUDA graphs -------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        max_pages = max_bs * ((max_context_len + self.page_size - 1) // self.page_size)
        self._graph_bufs = {
            "indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            "indices": torch.zeros(max_pages, dtype=torch.int32, device=self.device),
            "scratch": torch.zeros(max_pages, dtype=torch.int32, device=self.device),
            "last": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
        }

    def init_forward_metadata_capture(self, fb: ForwardBatch) -> None:
        if not fb.is_decode_only:
            raise ValueError("the flashinfer backend captures decode batches only")
        bs = fb.batch_size
        num_heads = self._heads_or_fail()
        b = self._graph_bufs
        wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self._tensor_cores(num_heads),
            paged_kv_indptr_buffer=b["indptr"][: bs + 1],
            paged_kv_indices_buffer=b["indices"],
            paged_kv_last_page_len_buffer=b["last"][:bs],
        )
        self._graph_wrappers[bs] = wrapper
        self._plan_decode(wrapper, fb, num_heads, out=b["scratch"])
        self.plan = _Plan(wrapper, decode=True)

    def init_forward_metadata_replay(self, fb: ForwardBatch) -> None:
        wrapper = self._graph_wrappers[fb.batch_size]
        self._plan_decode(wrapper, fb, self._heads_or_fail(), out=self._graph_bufs["scratch"])
        self.plan = _Plan(wrapper, decode=True)

    # -- attention ---------------------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        fb: ForwardBatch,
        scaling: float,
    ) -> torch.Tensor:
        pool = fb.kv_pool
        k_buf, v_buf = pool.get_kv(layer_id)
        store_kv(k, v, k_buf, v_buf, fb.out_cache_loc)
        if q.dtype != self.dtype:
            q = q.to(self.dtype)
        if abs(scaling - self.sm_scale) > 1e-12 * self.sm_scale:
            # The plan fixed sm_scale for every layer; a model with another scale folds the ratio into q.
            q = q * (scaling / self.sm_scale)
        if not q.is_contiguous():
            q = q.contiguous()
        return self.plan.wrapper.run(q, pool.paged_view(layer_id))
