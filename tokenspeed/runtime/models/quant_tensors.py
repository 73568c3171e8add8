"""Tensors of a quantized checkpoint that are not parameters of the model as loaded.

- `k_scale` / `v_scale` (`model.layers.N.self_attn.k_scale`, or under `k_proj` / `attn`): the per-tensor
  scales of an FP8 KV cache, per layer; collected into a `KVScales` for the KV pool.
- `input_scale`: a static activation scale. Skipped: FP8 GEMMs here scale activations per token at run
  time, which is at least as accurate as one calibrated scale per tensor.
- `weight_scale_inv` (block-wise releases) is a multiplier like `weight_scale`; it is renamed to it.

`--quantization-param-path` names a JSON file of KV scales in the layout vLLM writes
(`{"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"<tp rank>": {"<layer>": scale}}}}`, one
scale for K and V of a layer), read by `read_kv_scales_file`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_KV_SCALE = re.compile(r"(?:^|\.)layers\.(\d+)\..*\b([kv])_scale$")


@dataclass
class KVScales:
    """Per-layer K and V scales of an FP8 KV cache (stored value = real value / scale)."""

    k: dict[int, float] = field(default_factory=dict)
    v: dict[int, float] = field(default_factory=dict)
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.k or self.v)

    def per_layer(self, num_layers: int) -> tuple[list[float], list[float]]:
        """(k, v) scale of every layer; 1.0 where none is given."""
        return (
            [self.k.get(i, 1.0) for i in range(num_layers)],
            [self.v.get(i, 1.0) for i in range(num_layers)],
        )


def split_quant_tensors(
    weights: Iterable[tuple[str, torch.Tensor]], kv_scales: KVScales
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as the model loads them; KV scales go into `kv_scales`."""
    for name, tensor in weights:
        m = _KV_SCALE.search(name)
        if m:
            layer, which = int(m.group(1)), m.group(2)
            getattr(kv_scales, which)[layer] = float(tensor.float().max())
            kv_scales.source = "the checkpoint"
            continue
        if name.endswith(".input_scale"):
            continue
        if name.endswith(".weight_scale_inv"):
            name = name[: -len("_inv")]
        yield name, tensor


def read_kv_scales_file(path: str, num_layers: int, tp_rank: int = 0) -> KVScales:
    """KV scales from `--quantization-param-path`; raises ValueError naming the flag and what is wrong."""
    flag = f"--quantization-param-path {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{flag}: cannot read the file ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: not JSON ({e})") from None
    factors = (data.get("kv_cache") or {}).get("scaling_factor") if isinstance(data, dict) else None
    if not isinstance(factors, dict) or not factors:
        raise ValueError(
            f'{flag}: expected {{"kv_cache": {{"scaling_factor": {{"<tp rank>": {{"<layer>": scale}}}}}}}}'
        )
    rank = factors.get(str(tp_rank), factors.get(tp_rank))
    if not isinstance(rank, dict):
        raise ValueError(f"{flag}: kv_cache.scaling_factor has no entry for tensor-parallel rank {tp_rank}")
    scales = KVScales(source=path)
    for layer, value in rank.items():
        i = int(layer)
        if not 0 <= i < num_layers:
            raise ValueError(f"{flag}: layer {i} is outside the model's {num_layers} layers")
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{flag}: the scale of layer {i} must be a positive number, got {value!r}")
        scales.k[i] = scales.v[i] = float(value)
    return scales


def pool_kv_scales(
    quantized: bool, param_path: str | None, checkpoint: KVScales | None, num_layers: int
) -> tuple[list[float], list[float]] | None:
    """The (k, v) scales per layer an FP8 KV pool uses: `--quantization-param-path` when given, else the
    checkpoint's, else 1.0 (logged, since unit scales can cost accuracy on models with large K/V)."""
    if not quantized:
        return None
    scales = read_kv_scales_file(param_path, num_layers) if param_path else checkpoint
    if not scales:
        logger.info("KV cache: FP8 e4m3 with K/V scales 1.0 (no k_scale/v_scale in the checkpoint)")
        return [1.0] * num_layers, [1.0] * num_layers
    k, v = scales.per_layer(num_layers)
    logger.info("KV cache: FP8 e4m3 with per-layer K/V scales from %s (K %.4g..%.4g, V %.4g..%.4g)",
                scales.source, min(k), max(k), min(v), max(v))  # fmt: skip
    return k, v
