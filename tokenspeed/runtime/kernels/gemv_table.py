"""Which decode batches take the bf16 GEMV (`bf16_gemv.py`) rather than cuBLAS, per weight shape, per GPU.

On the H200 the GEMV beat cuBLAS on some of the Llama-3.1-8B shapes at one or two rows and lost on others
(gate_up at every batch, everything at four rows: `benchmarks/results/gpu_bf16_gemv.json`), so the choice
is per shape. A table is one file per device under `tuned/` (`NVIDIA_H200.json`, the device name with
spaces as underscores), mapping a weight shape ("N=6144,K=4096,dtype=bfloat16": output features, input
features, the weight's dtype) to the most rows for which the GEMV runs (0: never). A shape the table does
not name, or a device without a table, keeps cuBLAS. `benchmarks/bf16_gemv.py --table-out` writes it from
a run (the GEMV where it won by the margin); `--dense-gemv-backend auto` reads it.

`skinny` (optional) names, per shape and batch rows timed (16, 64), the configuration of the skinny
tensor-core GEMM (`skinny_gemm.py`) that beat cuBLAS there by the margin (`benchmarks/skinny_gemm.py
--table-out`): a batch of more rows than the GEMV takes runs it, at the configuration timed at the fewest
rows that hold the batch; other batches and shapes keep cuBLAS.

`configs` names, per shape and batch bucket (1, 2 or 4 rows), the launch configuration that won in that
run, and the GEMV then launches it as it is instead of autotuning at the shape's first call. Autotuning
picks by timing, so two processes could pick configurations that sum K in different orders: the same
prompt's greedy output could then change from one server start to the next. With the configuration
shipped, every start on that GPU computes the same bits. A shape or bucket without one is autotuned.

    {"format": "tokenspeed-dense-gemv/1", "device": "NVIDIA H200", "provenance": {...},
     "shapes": {"N=6144,K=4096,dtype=bfloat16": 1, "N=28672,K=4096,dtype=bfloat16": 0},
     "configs": {"N=6144,K=4096,dtype=bfloat16": {"1": {"BLOCK_N": 8, "BLOCK_K": 512, "SPLIT_K": 1,
                 "PREFETCH": 1, "num_warps": 4, "num_stages": 1}}}}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import torch

FORMAT = "tokenspeed-dense-gemv/1"
TUNED_DIR = Path(__file__).resolve().parent / "tuned"
_KEY = re.compile(r"N=(\d+),K=(\d+),dtype=(\w+)")
# a launch configuration's fields (bf16_gemv.DenseGemvConfig.to_table) and their least values
CONFIG_FIELDS = {"BLOCK_N": 1, "BLOCK_K": 1, "SPLIT_K": 1, "PREFETCH": 0, "num_warps": 1, "num_stages": 1}
BUCKETS = ("1", "2", "4")
# the skinny tensor-core GEMM's configuration (skinny_gemm.SkinnyGemmConfig): integer fields, their least
# values (all but num_stages powers of two), and its one flag
SKINNY_FIELDS = {"block_m": 16, "block_n": 16, "block_k": 16, "split_k": 1, "num_warps": 1, "num_stages": 1}
SKINNY_FLAGS = ("swap_ab",)


def shape_key(n: int, k: int, dtype: torch.dtype | str) -> str:
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    return f"N={n},K={k},dtype={name}"


def device_file(device_name: str, directory: Path = TUNED_DIR) -> Path:
    """A device's tuned file in `directory` (the MoE GEMV's table is named the same way)."""
    return directory / f"{device_name.strip().replace(' ', '_')}.json"


@dataclass(frozen=True)
class DenseGemvTable:
    """shape key -> the most rows the GEMV takes (0: never); shape key -> bucket -> launch configuration."""

    max_rows: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""
    configs: Mapping[str, Mapping[int, Mapping[str, int]]] = field(default_factory=lambda: MappingProxyType({}))
    # shape key -> batch rows timed -> the skinny GEMM's configuration that beat cuBLAS there
    skinny: Mapping[str, Mapping[int, Mapping[str, int | bool]]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def skinny_for(self, n: int, k: int, dtype: torch.dtype, rows: int) -> Mapping[str, int | bool] | None:
        """The skinny GEMM's configuration for a batch of `rows`: the one timed at the fewest rows >= `rows`
        (its one M block then holds the batch), or None (cuBLAS)."""
        per_rows = self.skinny.get(shape_key(n, k, dtype), {})
        fitting = [m for m in per_rows if m >= rows]
        return per_rows[min(fitting)] if fitting else None

    def config_for(self, n: int, k: int, dtype: torch.dtype, bucket: int) -> Mapping[str, int] | None:
        """The shipped launch configuration of an [n, k] weight at a batch bucket, or None (autotune)."""
        return self.configs.get(shape_key(n, k, dtype), {}).get(bucket)

    def rows_for(self, n: int, k: int, dtype: torch.dtype) -> int:
        """The most rows the GEMV takes for an [n, k] weight of `dtype` (0: never)."""
        return self.max_rows.get(shape_key(n, k, dtype), 0)

    def takes(self, n: int, k: int, dtype: torch.dtype, rows: int) -> bool:
        return rows <= self.rows_for(n, k, dtype)

    def __bool__(self) -> bool:
        return any(self.max_rows.values()) or bool(self.skinny)


def parse_table(data: object, path: Path) -> DenseGemvTable:
    """A table from a file's decoded JSON; ValueError naming the file and the offending key."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: must be a JSON object with 'format': {FORMAT!r} and 'shapes'")
    shapes = data.get("shapes")
    if not isinstance(shapes, dict):
        raise ValueError(f"{path}: 'shapes' must be an object: shape key -> the most rows the GEMV takes")
    out: dict[str, int] = {}
    for key, rows in shapes.items():
        if not _KEY.fullmatch(key):
            raise ValueError(
                f"{path}: shape key {key!r} is malformed; write it as 'N=<out features>,K=<in features>,"
                f"dtype=<weights dtype>', e.g. {shape_key(6144, 4096, torch.bfloat16)!r}"
            )
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise ValueError(f"{path}: shapes[{key!r}] must be a number of rows >= 0 (0: never), got {rows!r}")
        out[key] = rows
    configs = data.get("configs", {})
    if not isinstance(configs, dict):
        raise ValueError(f"{path}: 'configs' must be an object: shape key -> batch bucket -> configuration")
    parsed: dict[str, Mapping[int, Mapping[str, int]]] = {}
    for key, per_bucket in configs.items():
        where = f"{path}: configs[{key!r}]"
        if key not in out:
            raise ValueError(f"{where}: the shape is not in 'shapes'; name it there with its rows")
        if not isinstance(per_bucket, dict) or not set(per_bucket) <= set(BUCKETS):
            raise ValueError(f"{where} must map batch buckets {list(BUCKETS)} to configurations")
        parsed[key] = MappingProxyType({int(b): _parse_config(cfg, f"{where}[{b!r}]") for b, cfg in per_bucket.items()})
    return DenseGemvTable(
        MappingProxyType(out), source=str(path), configs=MappingProxyType(parsed),
        skinny=_parse_skinny(data.get("skinny", {}), path),
    )  # fmt: skip


def _parse_skinny(skinny: object, path: Path) -> Mapping[str, Mapping[int, Mapping[str, int | bool]]]:
    """The optional 'skinny' object: shape key -> batch rows (a decimal string) -> configuration."""
    if not isinstance(skinny, dict):
        raise ValueError(f"{path}: 'skinny' must be an object: shape key -> batch rows -> configuration")
    out = {}
    for key, per_rows in skinny.items():
        where = f"{path}: skinny[{key!r}]"
        if not _KEY.fullmatch(key):
            example = shape_key(6144, 4096, "bfloat16")
            raise ValueError(f"{where}: the shape key is malformed; write it as {example!r}")
        timed = list(per_rows) if isinstance(per_rows, dict) else []
        if not timed or not all(r.isdigit() and int(r) for r in timed):
            raise ValueError(f"{where} must map batch rows ('16', '64') to configurations")
        parsed = {}
        for rows, cfg in per_rows.items():
            at = f"{where}[{rows!r}]"
            fields = {*SKINNY_FIELDS, *SKINNY_FLAGS}
            if not isinstance(cfg, dict) or set(cfg) != fields:
                raise ValueError(f"{at} must be an object with exactly {sorted(fields)}")
            for name, least in SKINNY_FIELDS.items():
                value = cfg[name]
                whole = isinstance(value, int) and not isinstance(value, bool)
                if name == "num_stages" and (not whole or value < least):
                    raise ValueError(f"{at}[{name!r}] must be an integer >= {least}, got {value!r}")
                if name != "num_stages" and (not whole or value < least or value & (value - 1)):
                    raise ValueError(f"{at}[{name!r}] must be a power of two >= {least}, got {value!r}")
            if not all(isinstance(cfg[flag], bool) for flag in SKINNY_FLAGS):
                raise ValueError(f"{at}: {list(SKINNY_FLAGS)} must be true or false")
            if cfg["block_m"] < int(rows):
                raise ValueError(f"{at}: block_m {cfg['block_m']} must hold the {rows} rows it was timed at")
            parsed[int(rows)] = MappingProxyType(dict(cfg))
        out[key] = MappingProxyType(parsed)
    return MappingProxyType(out)


def _parse_config(cfg: object, where: str) -> Mapping[str, int]:
    if not isinstance(cfg, dict) or set(cfg) != set(CONFIG_FIELDS):
        raise ValueError(f"{where} must be an object with exactly {sorted(CONFIG_FIELDS)}, got {cfg!r}")
    for name, least in CONFIG_FIELDS.items():
        value = cfg[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{where}[{name!r}] must be an integer >= {least}, got {value!r}")
    return MappingProxyType(dict(cfg))


def load_table(path: str | Path) -> DenseGemvTable:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return parse_table(data, path)


def table_for_device(device_name: str, directory: Path = TUNED_DIR) -> DenseGemvTable:
    """The shipped table of `device_name`, or an empty one (cuBLAS everywhere)."""
    path = device_file(device_name, directory)
    return load_table(path) if path.is_file() else DenseGemvTable()


def to_json(
    device_name: str,
    max_rows: Mapping[str, int],
    provenance: dict,
    configs: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
    skinny: Mapping[str, Mapping[str, Mapping[str, int | bool]]] | None = None,
) -> dict:
    """The file `load_table` reads (what `benchmarks/bf16_gemv.py --table-out` writes, and
    `benchmarks/skinny_gemm.py --table-out` adds 'skinny' to)."""
    out = dict(format=FORMAT, device=device_name, provenance=provenance, shapes=dict(sorted(max_rows.items())))
    if configs:
        out["configs"] = {
            key: {b: dict(cfg) for b, cfg in sorted(per_bucket.items())} for key, per_bucket in sorted(configs.items())
        }
    if skinny:
        out["skinny"] = {
            key: {r: dict(cfg) for r, cfg in sorted(per_rows.items(), key=lambda kv: int(kv[0]))}
            for key, per_rows in sorted(skinny.items())
        }
    return out
