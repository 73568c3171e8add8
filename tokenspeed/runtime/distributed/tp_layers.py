"""Sharded stand-ins for the model's linear, embedding and LM-head layers (one TP group each).

Each class subclasses the layer it replaces, holds only this rank's slice and loads its slice from the
full checkpoint tensor, so the loader's completeness check still sees every parameter filled:

- `ShardedColumnLinear` / `ShardedMergedColumnLinear`: rows (output features) split, output stays local;
- `ShardedQKVLinear`: query heads split; key/value heads split, or replicated when the group is larger
  than the number of KV heads (each KV head then serves `size / kv_heads` consecutive ranks);
- `ShardedRowLinear`: columns (input features) split, partial outputs summed, bias added once after;
- `VocabParallelEmbedding` / `VocabParallelLMHead`: the vocabulary split in equal padded ranges; the
  embedding sums rows (each token found on one rank), the LM head gathers logits and drops the padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed.runtime.distributed.comm import all_gather, all_reduce
from tokenspeed.runtime.distributed.groups import RankGroup
from tokenspeed.runtime.layers.embedding import LMHead, VocabEmbedding
from tokenspeed.runtime.layers.linear import (
    ColumnLinear,
    MergedColumnLinear,
    QKVLinear,
    RowLinear,
    copy_weight,
)


def split_size(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(
            f"{what} ({total}) does not divide over tensor-parallel size {parts}; "
            "choose a --tp (or --dense-tp-size / --moe-tp-size) that divides it"
        )
    return total // parts


def _new_param(like: torch.Tensor, shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device), requires_grad=False)


class ShardedColumnLinear(ColumnLinear):
    def __init__(self, full: ColumnLinear, group: RankGroup):
        nn.Module.__init__(self)
        self.group = group
        self.in_features = full.in_features
        self.out_features = split_size(full.out_features, group.size, "output features")
        self.weight = _new_param(full.weight, (self.out_features, self.in_features))
        self.bias = None if full.bias is None else _new_param(full.bias, (self.out_features,))

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        n = self.out_features
        part = self.quant.narrow(tensor, param_name, 0, self.group.rank_in_group * n, n, name)
        return copy_weight(getattr(self, param_name), part, name)


class ShardedMergedColumnLinear(MergedColumnLinear):
    def __init__(self, full: MergedColumnLinear, group: RankGroup):
        nn.Module.__init__(self)
        self.group = group
        self.in_features = full.in_features
        self.output_sizes = [split_size(n, group.size, "MLP intermediate size") for n in full.output_sizes]
        self.out_features = sum(self.output_sizes)
        self.weight = _new_param(full.weight, (self.out_features, self.in_features))
        self.bias = None if full.bias is None else _new_param(full.bias, (self.out_features,))

    def load_shard(self, param_name: str, shard_id: int, tensor: torch.Tensor, name: str) -> int:
        n = self.output_sizes[shard_id]
        part = self.quant.narrow(tensor, param_name, 0, self.group.rank_in_group * n, n, name)
        return super().load_shard(param_name, shard_id, part, name)


class ShardedQKVLinear(QKVLinear):
    def __init__(self, full: QKVLinear, group: RankGroup):
        nn.Module.__init__(self)
        size, r = group.size, group.rank_in_group
        self.group = group
        self.head_dim = full.head_dim
        self.num_heads = split_size(full.num_heads, size, "attention heads")
        kv = full.num_kv_heads
        if kv >= size:
            self.num_kv_heads = split_size(kv, size, "key/value heads")
            self.kv_head_start = r * self.num_kv_heads
        else:
            if size % kv:
                raise ValueError(
                    f"key/value heads ({kv}) neither divide nor are divided by tensor-parallel size {size}; "
                    "choose another --tp"
                )
            self.num_kv_heads = 1
            self.kv_head_start = r // (size // kv)
        self.q_head_start = r * self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.in_features = full.in_features
        self.out_features = self.q_size + 2 * self.kv_size
        self.weight = _new_param(full.weight, (self.out_features, self.in_features))
        self.bias = None if full.bias is None else _new_param(full.bias, (self.out_features,))

    def load_shard(self, param_name: str, shard_id: str, tensor: torch.Tensor, name: str) -> int:
        d = self.head_dim
        if shard_id == "q":
            part = self.quant.narrow(tensor, param_name, 0, self.q_head_start * d, self.num_heads * d, name)
        else:
            start, n = self.kv_head_start * d, self.num_kv_heads * d
            part = self.quant.narrow(tensor, param_name, 0, start, n, name)
        return super().load_shard(param_name, shard_id, part, name)


class ShardedRowLinear(RowLinear):
    def __init__(self, full: RowLinear, group: RankGroup):
        nn.Module.__init__(self)
        self.group = group
        self.in_features = split_size(full.in_features, group.size, "input features")
        self.out_features = full.out_features
        self.weight = _new_param(full.weight, (self.out_features, self.in_features))
        self.bias = None if full.bias is None else _new_param(full.bias, (self.out_features,))

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        if param_name == "bias":
            return copy_weight(self.bias, tensor, name)
        n = self.in_features
        part = self.quant.narrow(tensor, param_name, 1, self.group.rank_in_group * n, n, name)
        return copy_weight(getattr(self, param_name), part, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(self.quant.apply(self, x, None), self.group)
        return y if self.bias is None else y + self.bias


class _VocabRange:
    def __init__(self, vocab_size: int, group: RankGroup):
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // group.size)
        self.start = group.rank_in_group * self.per_rank
        self.end = min(vocab_size, self.start + self.per_rank)

    def load_rows(self, dst: torch.Tensor, tensor: torch.Tensor, name: str) -> int:
        if tensor.shape[0] != self.vocab_size:
            raise ValueError(
                f"checkpoint weight {name!r} has {tensor.shape[0]} vocabulary rows, the config says "
                f"{self.vocab_size}; the config.json does not match the weights"
            )
        n = max(0, self.end - self.start)
        with torch.no_grad():
            dst[n:].zero_()  # padding rows of the last rank: never selected, gathered then dropped
        copy_weight(dst[:n], tensor[self.start : self.end], name)
        return dst.numel()


class _VocabRows:
    """This rank's range of vocabulary rows and their loading: what the sharded embedding and LM head share
    (listed first among their bases, so its ``__init__`` and ``load`` stand in for the full layer's)."""

    def __init__(self, full: VocabEmbedding | LMHead, group: RankGroup):
        nn.Module.__init__(self)
        self.group = group
        self.vocab_size = full.vocab_size
        self.range = _VocabRange(full.vocab_size, group)
        self.weight = _new_param(full.weight, (self.range.per_rank, full.weight.shape[1]))

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        return self.range.load_rows(self.weight, tensor, name)


class VocabParallelEmbedding(_VocabRows, VocabEmbedding):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.range.start
        outside = (local < 0) | (local >= self.range.end - self.range.start)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0)
        return all_reduce(out, self.group)


class VocabParallelLMHead(_VocabRows, LMHead):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.quant.logits(self, hidden)
        return all_gather(logits, self.group, dim=-1)[..., : self.vocab_size]
