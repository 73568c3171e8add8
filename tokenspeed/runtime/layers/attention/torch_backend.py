"""Reference attention over the paged KV cache, in plain PyTorch (CPU and GPU, any batch shape).

Each step, `init_forward_metadata` turns the batch into gather indices and masks once; every layer reuses
them. Requests with one new token (decodes, or a one-token chunk) are attended together in one padded,
batched SDPA call; each request with several new tokens gets its own SDPA call with the causal rule
"new token i sees cached slots [0, prefix + i]".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tokenspeed.runtime.layers.attention.backend import AttentionBackend

if TYPE_CHECKING:
    from tokenspeed.runtime.cache.kv_pool import KVPool
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch


@dataclass
class _Extend:
    start: int  # first new token in [0, T)
    length: int
    slots: torch.Tensor  # [seq_len] KV slots of the request
    mask: torch.Tensor  # [1, 1, length, seq_len] bool, True = attend


@dataclass
class _Metadata:
    decode_tokens: torch.Tensor | None = None  # [Bd] token index of each single-token request
    decode_slots: torch.Tensor | None = None  # [Bd, max_seq] slots, padded with slot 0
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, max_seq]
    extends: list[_Extend] = field(default_factory=list)


class TorchAttentionBackend(AttentionBackend):
    def __init__(
        self, model_config: Any = None, kv_pool: KVPool | None = None, device: Any = "cpu", **_: Any
    ):
        self.kv_pool = kv_pool
        self.device = torch.device(device)
        self.metadata = _Metadata()

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        seq_lens = fb.seq_lens_cpu or fb.seq_lens.tolist()
        ext_lens = fb.extend_lens_cpu or fb.extend_lens.tolist()
        device = fb.input_ids.device
        rows = fb.req_pool_indices.to(torch.long)
        md = _Metadata()
        decode_req, decode_tok = [], []
        start = 0
        for i, (seq_len, ext) in enumerate(zip(seq_lens, ext_lens, strict=True)):
            if ext == 1:
                decode_req.append(i)
                decode_tok.append(start)
            elif ext > 1:
                slots = fb.req_to_token[rows[i], :seq_len].to(torch.long)
                prefix = seq_len - ext
                key_pos = torch.arange(seq_len, device=device)
                query_pos = torch.arange(prefix, seq_len, device=device)
                mask = (key_pos[None, :] <= query_pos[:, None])[None, None]
                md.extends.append(_Extend(start, ext, slots, mask))
            start += ext
        if decode_req:
            max_seq = max(seq_lens[i] for i in decode_req)
            idx = torch.tensor(decode_req, device=device)
            lens = fb.seq_lens.to(device)[idx].to(torch.long)
            valid = torch.arange(max_seq, device=device)[None, :] < lens[:, None]
            slots = fb.req_to_token[rows[idx], :max_seq].to(torch.long)
            md.decode_tokens = torch.tensor(decode_tok, device=device)
            md.decode_slots = torch.where(valid, slots, torch.zeros_like(slots))
            md.decode_mask = valid[:, None, None, :]
        self.metadata = md

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch, scale: float
    ) -> torch.Tensor:
        pool = fb.kv_pool
        k_buf, v_buf = pool.get_kv(layer_id)
        md = self.metadata
        out = torch.empty_like(q)
        if md.decode_tokens is not None:
            qd = q[md.decode_tokens].unsqueeze(2)  # [Bd, H, 1, D]
            ks, vs = pool.k_scales[layer_id], pool.v_scales[layer_id]
            kd = pool.dequant(k_buf[md.decode_slots], ks, q.dtype).transpose(1, 2)  # [Bd, KV, S, D]
            vd = pool.dequant(v_buf[md.decode_slots], vs, q.dtype).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=md.decode_mask, scale=scale, enable_gqa=True
            )
            out[md.decode_tokens] = o.squeeze(2)
        for e in md.extends:
            qe = q[e.start : e.start + e.length].transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
            ke = pool.dequant(k_buf[e.slots], pool.k_scales[layer_id], q.dtype).transpose(0, 1)[None]
            ve = pool.dequant(v_buf[e.slots], pool.v_scales[layer_id], q.dtype).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qe, ke, ve, attn_mask=e.mask, scale=scale, enable_gqa=True)
            out[e.start : e.start + e.length] = o.squeeze(0).transpose(0, 1)
        return out
