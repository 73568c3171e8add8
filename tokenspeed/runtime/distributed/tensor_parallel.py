"""Tensor and expert parallelism applied to a built model: the model files hold no distributed code.

`apply_parallelism(model, groups, moe)` walks a model built on the meta device (before its weights are
loaded) and swaps layers for sharded ones (`tp_layers.py`, `moe/expert_parallel.py`):

    attention (attention TP group)  q/k/v heads split, o_proj row-parallel, head counts made local
    gated MLP (dense TP group)      gate/up column-parallel, down row-parallel
    sparse MoE (MoE EP or TP group) experts sharded by `ExpertLocation` (EP) or inside each expert (TP)
    embedding, LM head              vocabulary split over the attention TP group

The loader then fills each shard from the full checkpoint tensors. `load_parallel_model` does both; the
KV pool of a rank holds `local_kv_heads` heads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenspeed.config import memory_model
from tokenspeed.config.slices import ExpertPlan
from tokenspeed.runtime.distributed.groups import ParallelGroups
from tokenspeed.runtime.distributed.tp_layers import (
    ShardedMergedColumnLinear,
    ShardedQKVLinear,
    ShardedRowLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
)
from tokenspeed.runtime.layers.attention import PagedAttention
from tokenspeed.runtime.layers.embedding import LMHead, VocabEmbedding
from tokenspeed.runtime.layers.mlp import GatedMLP
from tokenspeed.runtime.models.llama import LlamaAttention
from tokenspeed.runtime.moe.expert_location import ExpertLocation
from tokenspeed.runtime.moe.expert_parallel import (
    ALL2ALL_BACKENDS,
    ExpertParallelState,
    ParallelMoeBlock,
)
from tokenspeed.runtime.moe.sparse_block import SparseMoeBlock

if TYPE_CHECKING:
    from tokenspeed.runtime.models.model_config import ModelConfig

logger = logging.getLogger(__name__)


def local_kv_heads(num_kv_heads: int, tp_size: int) -> int:
    """KV heads one rank stores (the memory model's rule, which the console's planner sizes with)."""
    return memory_model.kv_heads_per_rank(num_kv_heads, tp_size)


def _shard_attention(attn: LlamaAttention, groups: ParallelGroups) -> None:
    group = groups.attn_tp
    attn.qkv_proj = ShardedQKVLinear(attn.qkv_proj, group)
    attn.o_proj = ShardedRowLinear(attn.o_proj, group)
    attn.num_heads = attn.qkv_proj.num_heads
    attn.num_kv_heads = attn.qkv_proj.num_kv_heads
    paged: PagedAttention = attn.attn
    paged.num_heads, paged.num_kv_heads = attn.num_heads, attn.num_kv_heads


def _shard_mlp(mlp: GatedMLP, groups: ParallelGroups) -> None:
    group = groups.dense_tp
    mlp.gate_up_proj = ShardedMergedColumnLinear(mlp.gate_up_proj, group)
    mlp.down_proj = ShardedRowLinear(mlp.down_proj, group)


def _expert_state(model: nn.Module, groups: ParallelGroups, moe: ExpertPlan) -> ExpertParallelState:
    config = model.config
    location = ExpertLocation.from_init_arg(
        moe.init_expert_location,
        config.num_layers,
        config.num_experts,
        moe.num_redundant_experts,
        groups.moe_ep.size,
        algorithm=moe.eplb_algorithm,
    )
    return ExpertParallelState(
        location=location, group=groups.moe_ep, dispatch_algorithm=moe.dispatch_algorithm
    )


def apply_parallelism(
    model: nn.Module, groups: ParallelGroups, moe: ExpertPlan | None = None
) -> ExpertParallelState | None:
    """Swap the layers of `model` (in place) for this rank's shards; returns the EP state, if any.

    Expert parallelism (with redundant slots) is used when the MoE EP group has more than one rank or
    redundant experts are asked for; otherwise MoE layers are split over the MoE TP group.
    """
    moe = moe or ExpertPlan()
    if moe.all2all_backend not in ALL2ALL_BACKENDS:
        raise ValueError(
            f"--all2all-backend {moe.all2all_backend!r} is not available in this build; "
            f"use one of {list(ALL2ALL_BACKENDS)} (all-gather / reduce-scatter)"
        )
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, SparseMoeBlock)]
    use_ep = bool(blocks) and (groups.moe_ep.size > 1 or moe.num_redundant_experts > 0)
    state = _expert_state(model, groups, moe) if use_ep else None
    for module in list(model.modules()):
        if isinstance(module, LlamaAttention) and groups.attn_tp.size > 1:
            _shard_attention(module, groups)
        elif isinstance(module, GatedMLP) and groups.dense_tp.size > 1:
            _shard_mlp(module, groups)
    for name, block in blocks:
        if state is None and groups.moe_tp.size == 1:
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        group = state.group if state is not None else groups.moe_tp
        setattr(parent, leaf, ParallelMoeBlock(block, group, state))
    if groups.attn_tp.size > 1:
        _shard_vocab(model, groups)
    return state


def _shard_vocab(model: nn.Module, groups: ParallelGroups) -> None:
    for name, module in list(model.named_modules()):
        replacement = None
        if type(module) is VocabEmbedding:
            replacement = VocabParallelEmbedding(module, groups.attn_tp)
        elif type(module) is LMHead:
            replacement = VocabParallelLMHead(module, groups.attn_tp)
        if replacement is not None:
            parent_name, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, leaf, replacement)


@dataclass
class ParallelModel:
    model: nn.Module
    expert_state: ExpertParallelState | None


def load_parallel_model(
    model_config: ModelConfig,
    groups: ParallelGroups,
    load_format: str = "auto",
    device: torch.device | str = "cpu",
    seed: int | None = 0,
    moe: ExpertPlan | None = None,
) -> ParallelModel:
    """Build the model on the meta device, shard it for this rank, materialise it and load its weights."""
    from tokenspeed.runtime.models.loader import load_model

    holder: dict[str, ExpertParallelState | None] = {}

    def transform(model: nn.Module) -> None:
        holder["state"] = apply_parallelism(model, groups, moe)

    model = load_model(model_config, load_format, device, seed, transform=transform)
    return ParallelModel(model=model, expert_state=holder.get("state"))
