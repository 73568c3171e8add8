"""FP8 weights in the model's layers: which layers hold them, how they load, how they multiply.

An FP8 linear keeps `weight` in float8_e4m3fn and a float32 `weight_scale` (per-channel [out, 1], or per
128x128 tile [ceil(out/128), ceil(in/128)] for block-wise checkpoints); its `quant` is an `Fp8Linear`.
Stacked experts keep `w13` / `w2` in FP8 with `w13_scale` / `w2_scale` laid out the same way per expert.

- A checkpoint in FP8: the layers are converted on the meta device, before memory is allocated, and the
  FP8 tensors and their scales are copied in as they are. Which layers: those the checkpoint gives a scale
  for (`checkpoint_fp8_modules`), so a release that keeps its router or some layers in BF16 loads as is.
- `--quantization fp8` on an unquantized checkpoint: the model loads in its dtype, then every linear layer
  but the MoE router and the LM head, and every expert, is quantized per channel (`quantize_model`).

The GEMM dequantizes on the CPU (the float32 reference); on CUDA it goes through `kernels/fp8_gemm.py`
(decode-sized batches: the Triton FP8 GEMV of `kernels/fp8_gemv.py`; larger ones: `torch._scaled_mm` with
per-token activation scales, or a Triton block-scale GEMM), imported only there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed.runtime.layers.linear import LinearBase, ReplicatedLinear, Unquantized
from tokenspeed.runtime.layers.quantization.fp8_math import (
    FP8_DTYPE,
    block_scale_shape,
    dequantize,
    quantize_per_channel,
)

logger = logging.getLogger(__name__)

SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")


@dataclass(frozen=True)
class Fp8Linear(Unquantized):
    """The `quant` of an FP8 linear layer (`linear.Unquantized` is the default one)."""

    block: tuple[int, int] | None  # tile of the block-wise scales; None: per-channel [out, 1]

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.is_cuda:
            from tokenspeed.runtime.kernels import fp8_gemm

            return fp8_gemm.fp8_linear(x, layer.weight, layer.weight_scale, self.block, bias)
        return F.linear(x, dequantize(layer.weight, layer.weight_scale, self.block, x.dtype), bias)

    def rows(self, param_name: str, start: int, end: int, name: str) -> tuple[int, int]:
        return scale_rows(param_name, start, end, self.block, name)

    def narrow(
        self, tensor: torch.Tensor, param_name: str, dim: int, start: int, length: int, name: str
    ) -> torch.Tensor:
        return narrow_for_shard(tensor, param_name, dim, start, length, self.block, name)


def narrow_for_shard(
    tensor: torch.Tensor,
    param_name: str,
    dim: int,
    start: int,
    length: int,
    block: tuple[int, int] | None,
    name: str,
) -> torch.Tensor:
    """The part of a checkpoint tensor that a tensor-parallel shard holding weight elements [start,
    start + length) along `dim` (0: output rows, 1: input columns) loads: the weight's own slice; a
    per-row scale's rows (all of it for a column split); a per-tensor scale whole; a block scale's tiles,
    which the shard must cover exactly."""
    if not param_name.endswith("_scale"):
        return tensor.narrow(dim, start, length)
    if tensor.numel() == 1:
        return tensor
    if block is None:
        return tensor.narrow(0, start, length) if dim == 0 else tensor
    tile = block[dim]
    if start % tile or length % tile:
        raise ValueError(
            f"checkpoint weight {name!r}: a shard of {length} {('rows', 'columns')[dim]} from {start} does "
            f"not fall on the {tile}-wide tiles of weight_block_size; choose a --tp (or --moe-tp-size) "
            "that splits this layer on tile edges"
        )
    return tensor.narrow(dim, start // tile, length // tile)


def scale_rows(
    param_name: str, start: int, end: int, block: tuple[int, int] | None, name: str
) -> tuple[int, int]:
    """Rows of a block-wise scale holding weight rows [start, end): a stacked part (q/k/v, gate/up) must
    start and end on tile edges, or its tiles would mix two projections."""
    if block is None or not param_name.endswith("_scale"):
        return start, end
    bo = block[0]
    if start % bo or end % bo:
        raise ValueError(
            f"checkpoint weight {name!r}: rows {start}..{end} of a stacked projection do not fall on the "
            f"{bo}-row tiles of weight_block_size; this block-wise FP8 checkpoint cannot be stacked"
        )
    return start // bo, end // bo


def _fp8_param(shape: tuple[int, ...], device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=FP8_DTYPE, device=device), requires_grad=False)


def _scale_param(shape: tuple[int, ...], device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=torch.float32, device=device), requires_grad=False)


def _scale_shape(rows: int, cols: int, block: tuple[int, int] | None) -> tuple[int, int]:
    return block_scale_shape(rows, cols, block) if block else (rows, 1)


def convert_linear(layer: LinearBase, block: tuple[int, int] | None) -> None:
    """Give `layer` an (empty) FP8 weight and its scale, on the device its weight is on (meta, usually)."""
    device = layer.weight.device
    layer.weight = _fp8_param((layer.out_features, layer.in_features), device)
    layer.weight_scale = _scale_param(_scale_shape(layer.out_features, layer.in_features, block), device)
    layer.quant = Fp8Linear(block)


def is_experts(module: nn.Module) -> bool:
    return isinstance(getattr(module, "w13", None), torch.Tensor) and hasattr(module, "w2")


def convert_experts(experts: nn.Module, block: tuple[int, int] | None) -> None:
    """FP8 `w13` [E, 2I, H] / `w2` [E, H, I] with per-expert scales."""
    for name in ("w13", "w2"):
        w = getattr(experts, name)
        num, rows, cols = w.shape
        setattr(experts, name, _fp8_param(tuple(w.shape), w.device))
        setattr(experts, name + "_scale", _scale_param((num, *_scale_shape(rows, cols, block)), w.device))
    experts.fp8_block = block


def checkpoint_fp8_modules(model: nn.Module, names: list[str]) -> set[str]:
    """The model's modules that the checkpoint gives FP8 scales for (names of its tensors)."""
    modules: set[str] = set()
    for name in names:
        if not name.endswith(SCALE_SUFFIXES):
            continue
        target = model.resolve_weight(name.rsplit(".", 1)[0] + ".weight")
        if target is not None:
            modules.add(target.module)
    return modules


def convert_model(model: nn.Module, module_names: set[str], block: tuple[int, int] | None) -> int:
    """Turn the named linear layers and experts of a (meta) model into FP8 ones; returns how many."""
    found = dict(model.named_modules())
    unknown = sorted(module_names - set(found))
    if unknown:
        raise ValueError(f"the checkpoint has FP8 scales for layers the model does not have: {unknown[:4]}")
    for name in sorted(module_names):
        module = found[name]
        if isinstance(module, LinearBase):
            convert_linear(module, block)
        elif is_experts(module):
            convert_experts(module, block)
        else:
            raise ValueError(f"the checkpoint has FP8 scales for {name!r}, which is not a linear layer")
    return len(module_names)


def online_targets(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """What `--quantization fp8` quantizes: every linear but the MoE router (a few columns that pick the
    experts, kept exact), and every block of stacked experts. Embeddings and the LM head stay as loaded."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if (isinstance(m, LinearBase) and not isinstance(m, ReplicatedLinear)) or is_experts(m)
    ]


@torch.no_grad()
def quantize_model(model: nn.Module) -> int:
    """Quantize a loaded model's weights per channel (e4m3, amax / 448 scales); returns the layers done.

    One layer at a time, so the device holds at most one layer twice."""
    targets = online_targets(model)
    for _, module in targets:
        if isinstance(module, LinearBase):
            q, scale = quantize_per_channel(module.weight)
            module.weight = nn.Parameter(q, requires_grad=False)
            module.weight_scale = nn.Parameter(scale, requires_grad=False)
            module.quant = Fp8Linear(None)
        else:
            for name in ("w13", "w2"):
                q, scale = quantize_per_channel(getattr(module, name))
                setattr(module, name, nn.Parameter(q, requires_grad=False))
                setattr(module, name + "_scale", nn.Parameter(scale, requires_grad=False))
            module.fp8_block = None
    if targets and next(model.parameters()).is_cuda:
        torch.cuda.empty_cache()  # the full-precision copies are gone; the KV pool is sized after this
    return len(targets)


@dataclass(frozen=True)
class ExpertScales:
    """The scales of FP8 stacked experts, for the reference loop that dequantizes one expert at a time."""

    w13_scale: torch.Tensor
    w2_scale: torch.Tensor
    block: tuple[int, int] | None

    @classmethod
    def of(cls, experts: nn.Module) -> ExpertScales | None:
        if experts.w13.dtype != FP8_DTYPE:
            return None
        return cls(experts.w13_scale, experts.w2_scale, experts.fp8_block)

    def dequantize(
        self, expert: int, w13: torch.Tensor, w2: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            dequantize(w13, self.w13_scale[expert], self.block, dtype),
            dequantize(w2, self.w2_scale[expert], self.block, dtype),
        )
