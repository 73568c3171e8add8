"""Which decode token counts take the MoE GEMV (`gemv.py`), per expert shape, per GPU: a tuned JSON table.

Like vLLM's fused_moe configs, a table is keyed by (E, N, K, M, dtype, device): one file per device under
`tuned/` (`NVIDIA_H200.json`: the device name with spaces as underscores), holding per expert shape
("E=128,N=768,K=2048,dtype=bfloat16": E the experts stacked on this rank, redundant slots included, N the
intermediate size, K the hidden size, the weights' dtype) a map from M (tokens in the step) to a `MoeGemvConfig`'s fields, or null for the tensor-core path.
A step of T tokens takes the entry of the smallest M >= T; past the largest M, or for a shape or device
without a table, the tensor-core path (`configs.py`) runs.

The default is the tensor-core path: the GEMV runs only where a table measured on that device says so
(`benchmarks/moe_tune.py --gemv` writes it), because an earlier CUDA-core GEMV lost to it on the H200
(38.8 us vs 30.7 us a layer at one token). `TOKENSPEED_MOE_GEMV` overrides, for benchmarks: `off` (never),
`force` (the default `MoeGemvConfig` up to FORCE_MAX_TOKENS tokens, any shape), or the path of a table file.

    {"format": "tokenspeed-moe-gemv/1", "device": "NVIDIA H200", "provenance": {...},
     "shapes": {"E=128,N=768,K=2048,dtype=bfloat16": {"1": {"block_n": 16, ...}, "16": null}}}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from tokenspeed.runtime.kernels import gemv_table as dense_table
from tokenspeed.runtime.moe.kernels.gemv import MoeGemvConfig

FORMAT = "tokenspeed-moe-gemv/1"
ENV = "TOKENSPEED_MOE_GEMV"
TUNED_DIR = Path(__file__).resolve().parent / "tuned"
FORCE_MAX_TOKENS = 16
_FIELDS = tuple(f.name for f in dataclasses.fields(MoeGemvConfig))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def shape_key(num_experts: int, inter: int, hidden: int, dtype: torch.dtype | str) -> str:
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return f"E={num_experts},N={inter},K={hidden},dtype={name}"


def device_file(device_name: str, directory: Path = TUNED_DIR) -> Path:
    """This device's MoE table (named like the dense GEMV's, in this package's `tuned/`)."""
    return dense_table.device_file(device_name, directory)


@dataclass(frozen=True)
class GemvTable:
    """shape key -> ((max tokens M, config or None for the tensor-core path), ...) by increasing M."""

    shapes: Mapping[str, tuple[tuple[int, MoeGemvConfig | None], ...]]
    source: str = ""
    force_all: bool = False  # TOKENSPEED_MOE_GEMV=force

    def pick(
        self, num_experts: int, inter: int, hidden: int, dtype: torch.dtype, tokens: int
    ) -> MoeGemvConfig | None:
        """The GEMV config for a step of `tokens` tokens, or None: the tensor-core path."""
        if self.force_all:
            return MoeGemvConfig() if tokens <= FORCE_MAX_TOKENS else None
        for m, cfg in self.shapes.get(shape_key(num_experts, inter, hidden, dtype), ()):
            if tokens <= m:
                return cfg
        return None


EMPTY = GemvTable(MappingProxyType({}))


def _config(path: Path, where: str, raw: object) -> MoeGemvConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: {where} must be an object of MoeGemvConfig fields or null, got {raw!r}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{path}: {where} has unknown field(s) {unknown}; fields are {list(_FIELDS)}")
    bad = {k: v for k, v in raw.items() if not isinstance(v, int) or isinstance(v, bool)}
    if bad:
        raise ValueError(f"{path}: {where} needs integer values, got {bad}")
    try:
        return MoeGemvConfig(**raw)
    except ValueError as e:
        raise ValueError(f"{path}: {where}: {e}") from None


def _parse_shape(path: Path, key: str) -> None:
    parts = dict(p.split("=", 1) for p in key.split(",") if "=" in p)
    ok = list(parts) == ["E", "N", "K", "dtype"] and all(parts[k].isdigit() for k in ("E", "N", "K"))
    if not ok or key.count(",") != 3:
        raise ValueError(
            f"{path}: shape key {key!r} is malformed; write it as 'E=<experts>,N=<intermediate>,"
            f"K=<hidden>,dtype=<weights dtype>', e.g. {shape_key(128, 768, 2048, torch.bfloat16)!r}"
        )


def parse_table(data: object, path: Path) -> GemvTable:
    """A table from a file's decoded JSON; ValueError naming the file and the offending key."""
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a JSON object with 'format' and 'shapes'")
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: 'format' must be {FORMAT!r}, got {data.get('format')!r}")
    shapes = data.get("shapes")
    if not isinstance(shapes, dict):
        raise ValueError(f"{path}: 'shapes' must be an object: shape key -> {{tokens: config or null}}")
    out: dict[str, tuple[tuple[int, MoeGemvConfig | None], ...]] = {}
    for key, rows in shapes.items():
        _parse_shape(path, key)
        if not isinstance(rows, dict) or not rows:
            raise ValueError(f"{path}: shapes[{key!r}] must be a non-empty object: tokens -> config or null")
        entries = []
        for m, raw in rows.items():
            if not (isinstance(m, str) and m.isdigit() and int(m) > 0):
                raise ValueError(
                    f"{path}: shapes[{key!r}] key {m!r} must be a token count (a positive integer)"
                )
            entries.append((int(m), _config(path, f"shapes[{key!r}][{m!r}]", raw)))
        out[key] = tuple(sorted(entries, key=lambda e: e[0]))
    return GemvTable(MappingProxyType(out), source=str(path))


def load_table(path: str | Path) -> GemvTable:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such MoE GEMV table ({ENV} names a file that does not exist)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return parse_table(data, path)


def table_for_device(device_name: str, env: Mapping[str, str], directory: Path = TUNED_DIR) -> GemvTable:
    """The table a backend on `device_name` uses: `TOKENSPEED_MOE_GEMV` if set, else the shipped file of
    this device, else none (every step on the tensor-core path)."""
    override = env.get(ENV, "").strip()
    if override.lower() in ("off", "0", "false", "none"):
        return EMPTY
    if override.lower() in ("force", "1", "true", "on"):
        return dataclasses.replace(EMPTY, force_all=True, source=f"{ENV}=force")
    if override:
        return load_table(override)
    path = device_file(device_name, directory)
    return load_table(path) if path.is_file() else EMPTY


def to_json(
    device_name: str, shapes: Mapping[str, Mapping[int, MoeGemvConfig | None]], provenance: dict
) -> dict:
    """The file `load_table` reads (what `benchmarks/moe_tune.py --gemv` writes)."""
    return dict(
        format=FORMAT,
        device=device_name,
        provenance=provenance,
        shapes={
            key: {str(m): (dataclasses.asdict(c) if c is not None else None) for m, c in sorted(rows.items())}
            for key, rows in shapes.items()
        },
    )
