"""FP8 (e4m3) quantization arithmetic in plain PyTorch: the float32 reference every FP8 path agrees with.

Scales are multipliers: a weight is `q.float() * scale`, whatever the checkpoint calls the tensor
(`weight_scale_inv` in block-wise releases, `weight_scale` elsewhere). Layouts:

- per-channel: `scale` [out, 1], one per output row (a per-tensor scale is the same value on every row);
- block-wise: `scale` [ceil(out / bo), ceil(in / bi)], one per (bo x bi) tile; edge tiles may be partial.

Quantizing divides by `amax / 448` (448 is e4m3's largest finite value), so the largest value of a row
or tile lands on 448 and nothing overflows.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
# A row (or tile) of zeros still needs a finite, non-zero scale.
MIN_SCALE = 1e-12


def to_fp8(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype = FP8_DTYPE) -> torch.Tensor:
    """x / scale, clamped to the format's finite range (a cast alone would turn overflow into NaN)."""
    fmax = float(torch.finfo(dtype).max)
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype)


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., out, in] -> (fp8 weight, float32 scale [..., out, 1])."""
    amax = w.detach().abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return to_fp8(w, scale), scale


def dequantize_per_channel(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


def _expand_blocks(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> torch.Tensor:
    """[..., ceil(rows / bo), ceil(cols / bi)] tile scales -> [..., rows, cols] element scales."""
    bo, bi = block
    full = scale.repeat_interleave(bo, dim=-2).repeat_interleave(bi, dim=-1)
    return full[..., :rows, :cols]


def block_scale_shape(rows: int, cols: int, block: tuple[int, int]) -> tuple[int, int]:
    return -(-rows // block[0]), -(-cols // block[1])


def quantize_block(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., out, in] -> (fp8 weight, float32 tile scales [..., ceil(out/bo), ceil(in/bi)])."""
    *lead, rows, cols = w.shape
    bo, bi = block
    srows, scols = block_scale_shape(rows, cols, block)
    padded = torch.zeros(*lead, srows * bo, scols * bi, dtype=torch.float32, device=w.device)
    padded[..., :rows, :cols] = w.detach().float()
    tiles = padded.reshape(*lead, srows, bo, scols, bi)
    amax = tiles.abs().amax(dim=(-3, -1))
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return to_fp8(w, _expand_blocks(scale, rows, cols, block)), scale


def dequantize_block(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    rows, cols = q.shape[-2:]
    return (q.float() * _expand_blocks(scale.float(), rows, cols, block)).to(dtype)


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, dtype: torch.dtype
) -> torch.Tensor:
    """The weight an FP8 layer stands for, in `dtype` (block-wise when `block` is given)."""
    if block is None:
        return dequantize_per_channel(q, scale, dtype)
    return dequantize_block(q, scale, block, dtype)
