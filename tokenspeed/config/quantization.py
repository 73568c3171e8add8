"""Which weight quantization a server runs: read from `quantization_config` in config.json and
`--quantization`, without torch (`tokenspeed serve` checks it before any rank process starts).

Runnable: FP8 e4m3 weights, block-wise (`quant_method: fp8` with `weight_block_size`, the layout of the
Qwen3-FP8 and DeepSeek FP8 releases: `weight_scale_inv` per 128x128 tile), per-tensor or per-channel
(`quant_method: fp8` without blocks, compressed-tensors float8 groups, ModelOpt `quant_algo: FP8`), with
an optional static activation scale (`input_scale`); and `--quantization fp8` on an unquantized checkpoint,
which quantizes the weights per channel while loading. Anything else (AWQ, GPTQ, MXFP4, NVFP4,
bitsandbytes, ...) is refused by name before a weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED = (
    "FP8 checkpoints (quant_method fp8, block-wise or per-tensor; compressed-tensors float8; "
    "modelopt FP8) and --quantization fp8 on an unquantized checkpoint"
)
CHECKPOINT = "checkpoint"
ONLINE = "online"


@dataclass(frozen=True)
class WeightQuant:
    """FP8 weights of the linear layers (and experts) of a model."""

    source: str  # CHECKPOINT: the weights are stored in FP8; ONLINE: quantized while loading
    method: str  # as config.json or the flag spells it
    # block-wise tile (out, in); None: per-channel / per-tensor. Which layers are FP8 is read from the
    # checkpoint's scale tensors (layers/quantization/fp8.py), not from ignore lists that releases spell
    # differently; a static activation scheme's input_scale is skipped (activations scaled per token).
    block: tuple[int, int] | None = None

    def describe(self) -> str:
        kind = f"block-wise {self.block[0]}x{self.block[1]}" if self.block else "per-channel"
        where = (
            "from the checkpoint" if self.source == CHECKPOINT else "quantized at load (--quantization fp8)"
        )
        return f"FP8 e4m3 weights, {kind} scales, {where}"


def _refuse(what: str, path: str) -> ValueError:
    return ValueError(
        f"model {path!r} is quantized with {what} (quantization_config in config.json), which TokenSpeed "
        f"cannot run; supported: {SUPPORTED}. Serve an unquantized or FP8 checkpoint of this model"
    )


def _block(value: Any, path: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and v > 0 for v in value)
    ):
        raise ValueError(
            f"model {path!r}: quantization_config.weight_block_size must be two positive integers, got {value!r}"
        )
    return int(value[0]), int(value[1])


def _fp8(qc: dict, path: str) -> WeightQuant:
    scheme = str(qc.get("activation_scheme", "dynamic"))
    if scheme not in ("dynamic", "static"):
        raise ValueError(
            f"model {path!r}: quantization_config.activation_scheme {scheme!r} is not dynamic/static"
        )
    return WeightQuant(CHECKPOINT, "fp8", _block(qc.get("weight_block_size"), path))


def _compressed_tensors(qc: dict, path: str) -> WeightQuant:
    groups = qc.get("config_groups") or {}
    if not groups:
        raise _refuse("compressed-tensors (no config_groups)", path)
    blocks = set()
    for name, group in groups.items():
        w = group.get("weights") or {}
        if w.get("type") != "float" or int(w.get("num_bits", 0)) != 8:
            what = f"compressed-tensors {w.get('type', '?')}{w.get('num_bits', '?')} (group {name})"
            raise _refuse(what, path)
        strategy = w.get("strategy", "tensor")
        if strategy == "block":
            blocks.add(_block(w.get("block_structure"), path))
        elif strategy in ("tensor", "channel"):
            blocks.add(None)
        else:
            raise _refuse(f"compressed-tensors float8 with weight strategy {strategy!r}", path)
    if len(blocks) > 1:
        raise _refuse("compressed-tensors with mixed weight strategies", path)
    return WeightQuant(CHECKPOINT, "compressed-tensors", blocks.pop())


def _modelopt(qc: dict, path: str) -> WeightQuant:
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else qc
    algo = str(inner.get("quant_algo") or "")
    if algo.upper() != "FP8":
        raise _refuse(f"modelopt {algo or '(no quant_algo)'}", path)
    return WeightQuant(CHECKPOINT, "modelopt")


_READERS = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "modelopt": _modelopt}
# --quantization values that name the checkpoint format a reader above accepts.
_FLAG_MATCHES = {"fp8": ("fp8", "modelopt"), "compressed-tensors": ("compressed-tensors",)}


def weight_quant(config: dict, flag: str | None, path: str = "") -> WeightQuant | None:
    """The weight quantization of the checkpoint whose config.json is `config`, given `--quantization`.

    Raises ValueError naming the checkpoint's method when it is not runnable, or when the flag contradicts
    the checkpoint."""
    text = config.get("text_config", config)
    qc = config.get("quantization_config") or text.get("quantization_config")
    if not qc:
        if flag in (None, ""):
            return None
        if flag == "fp8":
            return WeightQuant(ONLINE, "fp8")
        raise ValueError(
            f"--quantization {flag}: model {path!r} is not a {flag} checkpoint (config.json has no "
            "quantization_config) and only --quantization fp8 quantizes an unquantized checkpoint at load"
        )
    method = str(qc.get("quant_method") or "").lower()
    reader = _READERS.get(method)
    if reader is None:
        raise _refuse(method or "quantized (no quant_method)", path)
    quant = reader(qc, path)
    if flag not in (None, "") and method not in _FLAG_MATCHES.get(flag, ()):
        raise ValueError(
            f"--quantization {flag} does not match model {path!r}, a {method} checkpoint; drop "
            "--quantization (the checkpoint's quantization_config is detected)"
        )
    return quant
