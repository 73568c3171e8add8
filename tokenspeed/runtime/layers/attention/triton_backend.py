"""`--attention-backend triton`: our own Triton kernels over the paged KV cache.

Per step, `init_forward_metadata` decides the path once for all layers:
- decode-only batches run the split-KV decode kernel (`kernels/decode_attention.py`);
- anything with a prefill chunk runs the extend kernel (`kernels/extend_attention.py`), which also
  handles the single-token rows of a mixed batch.
New K/V are stored with one fused launch before attending, or arrive stored by the fused RoPE + KV write
(`kernels/rope_store.py`, `kv_stored=True`). Decode is CUDA-graph capturable: its
metadata is a function of the batch size only, and the split scratch buffers are allocated once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tokenspeed.runtime.kernels.decode_attention import decode_attention, decode_num_splits
from tokenspeed.runtime.kernels.extend_attention import extend_attention
from tokenspeed.runtime.kernels.graph_scratch import ArrivalCounts, GraphScratch
from tokenspeed.runtime.kernels.kv_store import store_kv_into_pool
from tokenspeed.runtime.layers.attention.backend import AttentionBackend

if TYPE_CHECKING:
    from tokenspeed.runtime.cache.kv_pool import KVPool
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch


@dataclass
class _Metadata:
    decode: bool
    num_splits: int = 1
    qo_start: torch.Tensor | None = None  # [B] first new token of each request, extend path
    max_extend_len: int = 0


class TritonAttentionBackend(AttentionBackend):
    supports_cuda_graph = True
    supports_fused_rope_store = True

    def __init__(
        self,
        model_config: Any = None,
        kv_pool: KVPool | None = None,
        device: Any = "cuda",
        reduce_in_fp32: bool = False,
        **_: Any,
    ):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(
                "--attention-backend triton needs a CUDA GPU; use --attention-backend torch on CPU"
            )
        self.kv_pool = kv_pool
        self.reduce_in_fp32 = reduce_in_fp32
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.metadata = _Metadata(decode=True)
        # Split scratch (fp32 partial outputs and their lse) and the per (request, kv head) arrival counts of
        # a one-launch decode, grown in eager mode and sized for the largest captured batch by the warm-up
        # run before any graph is captured (`kernels/graph_scratch.py`)
        self._mid_o = GraphScratch("the decode attention's split outputs", torch.float32)
        self._mid_lse = GraphScratch("the decode attention's split lse", torch.float32)
        self.arrivals = ArrivalCounts("one-launch decode attention")
        self._graph_max_bs = 0

    # -- per-step metadata -------------------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.is_decode_only:
            kv_heads = fb.kv_pool.spec.num_kv_heads
            self.metadata = _Metadata(
                decode=True, num_splits=decode_num_splits(fb.batch_size, kv_heads, self.num_sms)
            )
            return
        ext = fb.extend_lens
        qo_start = torch.cumsum(ext, 0, dtype=torch.int32) - ext.to(torch.int32)
        max_ext = max(fb.extend_lens_cpu) if fb.extend_lens_cpu else int(ext.max().item())
        self.metadata = _Metadata(decode=False, qo_start=qo_start, max_extend_len=max_ext)

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        self._graph_max_bs = max_bs

    def init_forward_metadata_capture(self, fb: ForwardBatch) -> None:
        if not fb.is_decode_only:
            raise ValueError("the triton backend captures decode batches only")
        self.init_forward_metadata(fb)

    def init_forward_metadata_replay(self, fb: ForwardBatch) -> None:
        # Everything the captured kernels read (seq_lens, req_pool_indices, req_to_token) lives in the
        # graph's static buffers, and the split count depends on the batch size alone.
        self.init_forward_metadata(fb)

    # -- attention ---------------------------------------------------------------------------------

    def _scratch(self, bs: int, num_splits: int, num_heads: int, head_dim: int, kv_heads: int, device):
        """Flat fp32 scratch viewed as [bs, heads, splits, head_dim] and [bs, heads, splits], and the arrival
        counts; sized for the worst batch size up to the largest captured one, so every graph's view fits in
        the same allocation."""
        n = bs * num_heads * num_splits
        rows = max(bs, self._graph_max_bs)

        def graph_need() -> int:  # the most partials any batch up to the largest captured one writes
            return num_heads * max(
                b * decode_num_splits(b, kv_heads, self.num_sms) for b in range(1, rows + 1)
            )

        mid_o = self._mid_o.at_least(n * head_dim, device, lambda: graph_need() * head_dim)
        mid_lse = self._mid_lse.at_least(n, device, graph_need)
        return (
            mid_o[: n * head_dim].view(bs, num_heads, num_splits, head_dim),
            mid_lse[:n].view(bs, num_heads, num_splits),
            self.arrivals.at_least(rows * kv_heads, device),
        )

    def store_new_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> None:
        store_kv_into_pool(fb.kv_pool, layer_id, fb.out_cache_loc, k, v)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch, scale: float
    ) -> torch.Tensor:
        pool = fb.kv_pool
        k_buf, v_buf = pool.get_kv(layer_id)
        md = self.metadata
        # FP8 cache: the kernels read FP8 in q's dtype. A decode folds the per-tensor K scale into the
        # softmax scale and the V scale into the output; an extend attends over the new tokens' own K/V
        # (unrounded, as FlashInfer's ragged prefill does) and applies the scales to the cached prefix only.
        fresh = pool.quantized and not md.decode
        if pool.quantized and md.decode:
            scale = scale * pool.k_scales[layer_id]
        if q.stride(-1) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        if q.dtype != k_buf.dtype and not pool.quantized:
            q = q.to(k_buf.dtype)
        out = torch.empty_like(q)
        if md.decode:
            bs, num_heads, head_dim = q.shape
            mid_o, mid_lse, arrivals = self._scratch(bs, md.num_splits, num_heads, head_dim, k_buf.shape[1],
                                                     q.device)  # fmt: skip
            decode_attention(
                q,
                k_buf,
                v_buf,
                out,
                fb.req_to_token,
                fb.req_pool_indices,
                fb.seq_lens,
                mid_o,
                mid_lse,
                scale,
                md.num_splits,
                self.reduce_in_fp32,
                num_sms=self.num_sms,
                arrivals=arrivals,
            )
        else:
            fresh_kv = {}
            if fresh:
                k_new, v_new = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
                fresh_kv = dict(k_new=k_new, v_new=v_new, k_scale=pool.k_scales[layer_id],
                                v_scale=pool.v_scales[layer_id])  # fmt: skip
            extend_attention(
                q,
                out,
                k_buf,
                v_buf,
                fb.req_to_token,
                fb.req_pool_indices,
                fb.seq_lens,
                fb.extend_lens,
                md.qo_start,
                md.max_extend_len,
                scale,
                self.reduce_in_fp32,
                **fresh_kv,
            )
        if pool.quantized and md.decode and pool.v_scales[layer_id] != 1.0:
            out.mul_(pool.v_scales[layer_id])
        return out
