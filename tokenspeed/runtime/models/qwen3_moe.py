"""Qwen3-MoE: the Qwen3 decoder with sparse MoE blocks (top-k routing) in place of the MLP."""

from __future__ import annotations

import re

from torch import nn

from tokenspeed.runtime.layers.mlp import GatedMLP
from tokenspeed.runtime.models.qwen3 import Qwen3ForCausalLM
from tokenspeed.runtime.models.weight_utils import WeightTarget
from tokenspeed.runtime.moe.sparse_block import SparseMoeBlock

# `weight_scale`: the scale of an FP8 expert (the loader names `weight_scale_inv` so too)
_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale)$")
_STACKED_EXPERTS = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")
_PARTS = {"gate_proj": ("w13", "gate"), "up_proj": ("w13", "up"), "down_proj": ("w2", "down")}


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def is_moe_layer(self, layer_id: int) -> bool:
        hf = self.config.hf_config
        step = int(getattr(hf, "decoder_sparse_step", 1) or 1)
        mlp_only = set(getattr(hf, "mlp_only_layers", None) or [])
        return self.config.num_experts > 0 and layer_id not in mlp_only and (layer_id + 1) % step == 0

    def make_mlp(self, layer_id: int) -> nn.Module:
        if not self.is_moe_layer(layer_id):
            return GatedMLP(self.config.hidden_size, self.config.intermediate_size)
        hf = self.config.hf_config
        return SparseMoeBlock(
            hidden_size=self.config.hidden_size,
            intermediate_size=hf.moe_intermediate_size,
            num_experts=self.config.num_experts,
            top_k=self.config.num_experts_per_tok,
            renormalize=bool(getattr(hf, "norm_topk_prob", False)),
            layer_id=layer_id,
        )

    def resolve_weight(self, name: str) -> WeightTarget | None:
        m = _PER_EXPERT.match(name)
        if m:
            param, part = _PARTS[m.group(3)]
            suffix = "_scale" if m.group(4) == "weight_scale" else ""
            return WeightTarget(m.group(1), param + suffix, (int(m.group(2)), part))
        m = _STACKED_EXPERTS.match(name)
        if m:
            return WeightTarget(m.group(1), "w13" if m.group(2) == "gate_up_proj" else "w2")
        return super().resolve_weight(name)
