"""Mapping checkpoint tensors onto model parameters, with a completeness check.

A model resolves each checkpoint name to (module path, parameter, shard): `shard` is None for a whole
parameter, or a key the module's `load_shard` understands (e.g. "q" of a stacked qkv, or
(expert, "gate") of stacked experts). Values written are counted per parameter, so a parameter only
partly covered by the checkpoint (a missing `k_proj`) is reported as missing too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from tokenspeed.runtime.layers.linear import copy_weight


@dataclass(frozen=True)
class WeightTarget:
    module: str
    param: str
    shard: object = None


def load_into(module: nn.Module, target: WeightTarget, tensor: torch.Tensor, name: str) -> int:
    if target.shard is not None:
        return module.load_shard(target.param, target.shard, tensor, name)
    load = getattr(module, "load", None)
    if load is not None:
        return load(target.param, tensor, name)
    return copy_weight(getattr(module, target.param), tensor, name)


def _summarise(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def load_checkpoint_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], resolve
) -> set[str]:
    """Load every (name, tensor) through `resolve(name) -> WeightTarget | None` (None: skip it).

    Raises ValueError naming the checkpoint weights the model has no place for and the model parameters
    the checkpoint did not fill. Returns the names of the parameters loaded.
    """
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    written: dict[str, int] = {}
    unexpected: list[str] = []
    for name, tensor in weights:
        target = resolve(name)
        if target is None:
            continue
        module = modules.get(target.module)
        full = f"{target.module}.{target.param}" if target.module else target.param
        if module is None or full not in params:
            unexpected.append(name)
            continue
        written[full] = written.get(full, 0) + load_into(module, target, tensor, name)
    missing = [n for n, p in params.items() if written.get(n, 0) < p.numel()]
    if unexpected or missing:
        parts = []
        if unexpected:
            parts.append(
                f"{len(unexpected)} checkpoint weight(s) the model does not have: {_summarise(unexpected)}"
            )
        if missing:
            parts.append(f"{len(missing)} model parameter(s) not in the checkpoint: {_summarise(missing)}")
        raise ValueError(
            "the weights do not match the model config: " + "; ".join(parts) + ". Check that config.json "
            "(and --hf-overrides) belong to these weights"
        )
    return set(written)
