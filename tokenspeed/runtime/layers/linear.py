"""Linear layers of the models, as small classes a tensor-parallel pass can swap or shard.

The model files hold no distributed code: the split each layer admits is named by its class
(`ColumnLinear` splits the output dimension, `RowLinear` the input dimension), and the stacked layers
(`QKVLinear`, `MergedColumnLinear`) know where each checkpoint tensor lands, so a sharded replacement
only has to re-implement `load` / `load_shard` for its slice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _per_row_scale(dst: torch.Tensor, src: torch.Tensor, name: str) -> torch.Tensor | None:
    """An FP8 scale given per tensor ([] or [1]) or per row ([out]) as the per-row [out, 1] column it is
    kept as (a per-tensor scale of a stacked projection covers only that projection's rows)."""
    if not name.endswith(("weight_scale", "weight_scale_inv")) or dst.dim() < 1 or dst.shape[-1] != 1:
        return None
    if src.numel() == 1:
        return src.reshape(()).expand(dst.shape)
    if src.numel() == dst.numel():
        return src.reshape(dst.shape)
    return None


def copy_weight(dst: torch.Tensor, src: torch.Tensor, name: str) -> int:
    """Copy a checkpoint tensor into (a slice of) a parameter; returns the number of values written."""
    if tuple(dst.shape) != tuple(src.shape):
        scale = _per_row_scale(dst, src, name)
        if scale is None:
            raise ValueError(
                f"checkpoint weight {name!r} has shape {tuple(src.shape)} but the model expects "
                f"{tuple(dst.shape)}; the config.json does not match the weights"
            )
        src = scale
    with torch.no_grad():
        dst.copy_(src)
    return dst.numel()


class Unquantized:
    """How a linear layer with weights in the model's dtype multiplies (the default `quant` of a layer;
    `layers/quantization/fp8.py` gives FP8 layers another one, `layers/dense_gemv.py` decode batches one)."""

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def logits(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """An LM head's float32 logits x W^T."""
        return F.linear(x, layer.weight).float()

    def rows(self, param_name: str, start: int, end: int, name: str) -> tuple[int, int]:
        """The rows of `param_name` that hold output rows [start, end) of the weight."""
        return start, end

    def narrow(
        self, tensor: torch.Tensor, param_name: str, dim: int, start: int, length: int, name: str
    ) -> torch.Tensor:
        """The part of checkpoint tensor `param_name` a shard holding weight elements [start, start +
        length) along `dim` (0: output rows, 1: input columns) loads."""
        return tensor.narrow(dim, start, length)


UNQUANTIZED = Unquantized()


class LinearBase(nn.Module):
    """y = x W^T (+ b) with W stored [out_features, in_features], like Hugging Face checkpoints."""

    quant: Unquantized = UNQUANTIZED

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant.apply(self, x, self.bias)

    def load(self, param_name: str, tensor: torch.Tensor, name: str) -> int:
        return copy_weight(getattr(self, param_name), tensor, name)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class ReplicatedLinear(LinearBase):
    """Kept whole on every rank (e.g. the MoE router)."""


class ColumnLinear(LinearBase):
    """Output features may be split across ranks; the output is then gathered or consumed locally."""


class RowLinear(LinearBase):
    """Input features may be split across ranks; partial outputs are then summed."""


class MergedColumnLinear(ColumnLinear):
    """Several column linears sharing an input, stacked on the output dimension (gate and up)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def shard_range(self, shard_id: int) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard_id])
        return start, start + self.output_sizes[shard_id]

    def load_shard(self, param_name: str, shard_id: int, tensor: torch.Tensor, name: str) -> int:
        start, end = self.quant.rows(param_name, *self.shard_range(shard_id), name)
        return copy_weight(getattr(self, param_name)[start:end], tensor, name)


class QKVLinear(ColumnLinear):
    """q, k and v projections stacked on the output dimension: [q heads | k heads | v heads] x head_dim."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False
    ):
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads

    def shard_range(self, shard_id: str) -> tuple[int, int]:
        offsets = {"q": (0, self.q_size), "k": (self.q_size, self.kv_size)}
        offsets["v"] = (self.q_size + self.kv_size, self.kv_size)
        start, size = offsets[shard_id]
        return start, start + size

    def load_shard(self, param_name: str, shard_id: str, tensor: torch.Tensor, name: str) -> int:
        start, end = self.quant.rows(param_name, *self.shard_range(shard_id), name)
        return copy_weight(getattr(self, param_name)[start:end], tensor, name)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
