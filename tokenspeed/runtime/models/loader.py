"""Build a model on the meta device, materialise it on the target device, and fill its weights.

Formats (`--load-format`): `safetensors` (single file or sharded with an index), `pt` (`*.bin` / `*.pt`,
sharded with an index), `auto` (safetensors when present, else pt), and `dummy` (random weights,
deterministic for a seed on a given device type, for benchmarks that need only the shapes). A server draws
its dummy weights from `DUMMY_WEIGHTS_SEED`, not from `--seed` (which is drawn at random when unset): every
start of a benchmark then runs the same model, as vLLM's dummy weights are fixed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from tokenspeed.config.quantization import CHECKPOINT
from tokenspeed.runtime.layers.quantization import fp8
from tokenspeed.runtime.models.model_config import ModelConfig
from tokenspeed.runtime.models.quant_tensors import KVScales, split_quant_tensors
from tokenspeed.runtime.models.registry import get_model_class
from tokenspeed.runtime.startup_progress import Progress, human_bytes

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")


def _indexed_files(folder: Path, index_name: str) -> list[Path] | None:
    index = folder / index_name
    if not index.is_file():
        return None
    weight_map = json.loads(index.read_text()).get("weight_map", {})
    return [folder / f for f in sorted(set(weight_map.values()))]


def weight_files(folder: str | Path, load_format: str) -> tuple[str, list[Path]]:
    """The (format, files) to read for `load_format`; raises ValueError naming what was looked for."""
    folder = Path(folder)
    if load_format not in LOAD_FORMATS:
        raise ValueError(
            f"--load-format {load_format!r} is not supported; choose one of {', '.join(LOAD_FORMATS)}"
        )
    if load_format in ("auto", "safetensors"):
        # An index names the shards of this checkpoint; other *.safetensors files (e.g. a consolidated
        # copy next to the shards) must not be read twice.
        files = _indexed_files(folder, "model.safetensors.index.json") or sorted(folder.glob("*.safetensors"))
        if files:
            return "safetensors", files
        if load_format == "safetensors":
            raise ValueError(f"--load-format safetensors: no *.safetensors files in {folder}")
    files = _indexed_files(folder, "pytorch_model.bin.index.json") or sorted(folder.glob("*.bin"))
    files = files or sorted(folder.glob("*.pt"))
    files = [f for f in files if f.name != "training_args.bin"]
    if not files:
        raise ValueError(
            f"no weights in {folder}: looked for *.safetensors, *.bin and *.pt "
            "(use --load-format dummy for random weights)"
        )
    return "pt", files


def iterate_weights(
    files: list[Path], fmt: str, show_progress: bool | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from every file, on the CPU, one shard at a time.

    Progress (bytes read and rate) goes to stderr: redrawn in place on a terminal, a log line every few
    seconds otherwise, and a summary line at the end; `show_progress=False` keeps it quiet."""
    total = sum(p.stat().st_size for p in files if p.is_file())
    progress = Progress("weights", total, logger) if show_progress is not False else None
    for path in files:
        if not path.is_file():
            raise ValueError(f"weight file {path} named by the index is missing")
        if fmt == "safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    if progress is not None:
                        progress.advance(tensor.numel() * tensor.element_size())
                    yield name, tensor
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(state, dict):
                raise ValueError(f"{path} does not hold a state dict of named tensors")
            for name, tensor in state.items():
                if progress is not None:
                    progress.advance(tensor.numel() * tensor.element_size())
                yield name, tensor
            del state
    if progress is not None:
        progress.finish()


def tensor_names(files: list[Path], fmt: str) -> list[str]:
    """The names of a checkpoint's tensors, without reading them (safetensors headers; pt files mapped)."""
    names: list[str] = []
    for path in files:
        if fmt == "safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device="cpu") as f:
                names.extend(f.keys())
        else:
            names.extend(torch.load(str(path), map_location="cpu", weights_only=True, mmap=True).keys())
    return names


# The seed of a server's `--load-format dummy` weights: the same weights at every start, whatever `--seed` is.
DUMMY_WEIGHTS_SEED = 0


def _init_dummy(model: nn.Module, seed: int, std: float) -> None:
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)


def init_buffers(model: nn.Module) -> None:
    """Fill non-persistent buffers (rotary tables) after materialising, and re-tie shared weights."""
    for module in model.modules():
        if module is not model and hasattr(module, "init_buffers"):
            module.init_buffers()
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def build_model(
    model_config: ModelConfig,
    device: torch.device | str,
    transform: Callable[[nn.Module], None] | None = None,
    fp8_names: list[str] | None = None,
) -> nn.Module:
    """The model with uninitialised parameters on `device`, in `model_config.dtype`.

    `transform` edits the model while it is still on the meta device (tensor parallelism swaps layers for
    this rank's shards there, so only the shards are ever allocated). `fp8_names`, the tensor names of an
    FP8 checkpoint, turn the layers it holds in FP8 into FP8 layers there too.
    """
    cls = get_model_class(model_config.architecture)
    with torch.device("meta"):
        model = cls(model_config)
    if transform is not None:
        transform(model)
    model = model.to(dtype=model_config.dtype)
    if fp8_names is not None:
        block = model_config.weight_quant.block if model_config.weight_quant else None
        n = fp8.convert_model(model, fp8.checkpoint_fp8_modules(model, fp8_names), block)
        logger.info("weights: %d layers in FP8 (%s)", n, model_config.weight_quant.describe())
    model = model.to_empty(device=device)
    init_buffers(model)
    return model.eval()


def load_model(
    model_config: ModelConfig,
    load_format: str = "auto",
    device: torch.device | str = "cpu",
    seed: int | None = 0,
    transform: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Build the model for `model_config` and load its weights; raises ValueError on a mismatch."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(
            f"--load-format {load_format!r} is not supported; choose one of {', '.join(LOAD_FORMATS)}"
        )
    files: tuple[str, list[Path]] | None = None
    if load_format != "dummy":
        files = weight_files(model_config.model_path, load_format)  # fail before allocating memory
    quant = model_config.weight_quant
    # An FP8 checkpoint loads into FP8 layers; random weights (dummy) are quantized like --quantization fp8.
    fp8_names = (
        tensor_names(files[1], files[0])
        if quant is not None and quant.source == CHECKPOINT and files
        else None
    )
    model = build_model(model_config, device, transform, fp8_names)
    kv_scales = KVScales()
    if files is None:
        started = time.monotonic()
        std = float(getattr(model_config.hf_config, "initializer_range", 0.02) or 0.02)
        _init_dummy(model, seed or 0, std)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        logger.info("weights: %s of random values (--load-format dummy) in %.1f s", human_bytes(size),
                    time.monotonic() - started)  # fmt: skip
    else:
        fmt, paths = files
        logger.info("weights: reading %d %s file(s) from %s", len(paths), fmt, model_config.model_path)
        with torch.no_grad():
            model.load_weights(split_quant_tensors(iterate_weights(paths, fmt), kv_scales))
    if quant is not None and fp8_names is None:
        started = time.monotonic()
        n = fp8.quantize_model(model)
        logger.info(
            "weights: %d layers quantized to FP8 e4m3 per channel in %.1f s", n, time.monotonic() - started
        )
    model.kv_scales = kv_scales
    return model
