"""A sparse MoE block: router linear, top-k selection, experts; counts the routed load for the recorder.

Routing and experts run on the block's backend (`backend.py`). The expert-distribution recorder's
counts are accumulated on the device, into the recorder's persistent buffer, by the routing itself, so a
captured decode step keeps counting on every replay. CUDA-graph padding rows are not counted: they write
their K/V to slot 0, the KV pool's reserved padding page (`cache/kv_pool.py`), which no real token uses,
so `out_cache_loc != 0` marks the real tokens on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tokenspeed.runtime.layers.linear import ReplicatedLinear
from tokenspeed.runtime.moe.backend import UsesMoeBackend
from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.experts import TorchExperts
from tokenspeed.runtime.moe.router import TopKRouter

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch


def recorder_sink(fb: ForwardBatch | None, layer_id: int) -> tuple[object, torch.Tensor | None]:
    """(recorder, device counts row): the row is None when the recorder takes ids on the host
    (`record`, per_token mode, or any other recorder object)."""
    rec = fb.expert_recorder if fb is not None else None
    if isinstance(rec, ExpertDistributionRecorder):
        return rec, rec.device_counts(layer_id)
    return rec, None


class SparseMoeBlock(UsesMoeBackend):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        layer_id: int,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.router = TopKRouter(top_k, renormalize)
        self.experts = TorchExperts(num_experts, hidden_size, intermediate_size)

    def routed(self, x: torch.Tensor, logits: torch.Tensor, fb: ForwardBatch | None) -> torch.Tensor:
        rec, counts = recorder_sink(fb, self.layer_id)
        mask = fb.out_cache_loc if counts is not None else None
        top_k, renorm = self.router.top_k, self.router.renormalize
        if rec is None or counts is not None:  # nothing to hand the host: the backend may route in-kernel
            return self.backend.route_experts(self.experts, x, logits, top_k, renorm, counts, mask)
        weights, ids = self.backend.route(logits, top_k, renorm, None, counts, mask)
        rec.record(self.layer_id, ids)
        return self.backend.experts(self.experts, x, weights, ids)
