"""ForwardBatch: the one object a model forward receives (passed in, never global).

The model runner builds it from the scheduler's `ScheduledBatch`; models and layers read it; attention
backends prepare their per-step metadata from it once (`init_forward_metadata`) before the layers run.

Layout of a step with B requests and T new tokens (prefill chunks and decodes mixed, in request order):

    input_ids, positions, out_cache_loc      [T]   new tokens, their absolute positions, and the KV slot
                                                   each new token's K/V is written to
    req_pool_indices, seq_lens, extend_lens  [B]   row of req_to_token, tokens in cache after this step,
    extend_prefix_lens                             new tokens this step, tokens already cached before it
    logits_indices                           [B]   index in [0, T) of each request's last new token
    req_to_token[row, :seq_len]                    the KV slot of every token of the request

Invariants: sum(extend_lens) == T; extend_prefix_lens + extend_lens == seq_lens; a decode has
extend_len 1. Attention for new token i of request r sees slots req_to_token[row_r, :prefix_r + i + 1].

A verify step (speculative decoding) on the GPU is laid out as a decode of its tokens: each of a request's
last token and k drafts is a row of its own (B = T, the request's table row repeated, seq_len = the token's
position + 1), which is the rule above, so decode kernels and decode CUDA graphs run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tokenspeed.runtime.cache.kv_pool import KVPool


@dataclass
class AuxCapture:
    """Target hidden states an EAGLE3 draft reads: the residual stream after each of `layer_ids` (hidden +
    residual, before the final norm), for every token of the step."""

    layer_ids: tuple[int, ...]
    states: dict[int, torch.Tensor] = field(default_factory=dict)

    def wants(self, layer_id: int) -> bool:
        return layer_id in self.layer_ids

    def stacked(self) -> torch.Tensor:
        """[T, len(layer_ids) * H], in the order of `layer_ids`."""
        return torch.cat([self.states[i] for i in self.layer_ids], dim=-1)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor
    logits_indices: torch.Tensor
    req_to_token: torch.Tensor
    kv_pool: KVPool
    attn_backend: Any  # AttentionBackend; typed loosely to keep this module free of layer imports
    # host copies, so backends can plan without a device sync
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_lens_cpu: list[int] = field(default_factory=list)
    is_decode_only: bool = False
    # per-step MoE hook (expert-distribution recorder); None when recording is off
    expert_recorder: Any = None
    # EAGLE3: the target layers whose output (the residual stream) the model stores here, per token
    aux_capture: AuxCapture | None = None
    # a speculative verify step (a batch with drafts), in either layout
    is_verify: bool = False

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
