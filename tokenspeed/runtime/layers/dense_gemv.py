"""`--dense-gemv-backend`: how the bf16/fp16 linear layers and the LM head multiply decode batches of 1-4 rows.

- `triton`: the Triton GEMV of `kernels/bf16_gemv.py` (one pass over the weight, autotuned per shape and
  batch; the LM head's logits come out in float32 from its accumulators) for every shape; other batches,
  dtypes and devices still go through `F.linear` (cuBLAS). Needs a CUDA GPU and Triton.
- `torch`: `F.linear` always.
- `auto` (the default): on CUDA, the GEMV for the shapes and batches the GPU's tuned table names
  (`kernels/gemv_table.py`: on the H200 the GEMV won on some Llama-3.1-8B and Qwen3-30B-A3B shapes at one
  to four rows and lost on others), cuBLAS for the rest; `torch` where no table ships for the GPU (only the
  H200's does) and on the CPU.

Where the table names a skinny tensor-core GEMM configuration for a shape (`kernels/skinny_gemm.py`, written
by `benchmarks/skinny_gemm.py --table-out` where it beat cuBLAS), batches of more rows than the GEMV takes, up
to the rows it was timed at, run it instead of cuBLAS (layers without a bias; none ships yet).

Where the table also ships the launch configuration that won for a shape and batch bucket, the GEMV runs
it rather than autotuning, so every process computes the same bits (greedy output does not change from
one start to the next). The choice is made once, after the weights are loaded: each linear layer whose multiply is the plain
`linear.UNQUANTIZED` (so not an FP8 layer, which has its own GEMV) and the LM head are handed the chosen
object as their `quant`; nothing is patched into classes or modules. Under CUDA graphs a call is device
work only (the autotuner runs in the runner's eager warm-up before each capture).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed.runtime.kernels.gemv_table import DenseGemvTable, table_for_device
from tokenspeed.runtime.kernels.graph_scratch import ArrivalCounts
from tokenspeed.runtime.layers.backend_choice import require_triton, resolve_choice
from tokenspeed.runtime.layers.embedding import LMHead
from tokenspeed.runtime.layers.linear import UNQUANTIZED, LinearBase, Unquantized

logger = logging.getLogger(__name__)
FLAG = "--dense-gemv-backend"


class TritonGemv(Unquantized):
    """Decode-sized batches of a bf16/fp16 CUDA weight through the Triton GEMV; the rest as `Unquantized`."""

    def __init__(self, table: DenseGemvTable | None = None) -> None:
        """`table`: the shapes and batches that take the GEMV (None: every shape it supports)."""
        from tokenspeed.runtime.kernels import bf16_gemv, skinny_gemm

        self._gemv = bf16_gemv
        self._skinny = skinny_gemm
        # batches past the GEMV's rows: the table's skinny-GEMM configuration per (shape, rows), looked up
        # once; the arrival counts that both kernels' split-K launches count in (one after another, each
        # leaving them at zero, so every layer shares them)
        self._skinny_for: dict[tuple[int, int, torch.dtype, int], object] = {}
        self._arrivals = ArrivalCounts("the dense GEMV and skinny GEMM")
        self.max_rows = bf16_gemv.GEMV_MAX_M
        self.table = table
        # the table's verdict per weight shape, looked up once rather than on every decode call
        self._rows_for: dict[tuple[int, int, torch.dtype], int] = {}
        # the table's launch configuration per (shape, batch bucket); None: the autotuner picks
        self._config_for: dict[tuple[int, int, torch.dtype, int], object] = {}
        # the split-K arrival counts per (output rows, configuration)
        self._tiles_for: dict[tuple[int, object], int] = {}

    def use_table(self, table: DenseGemvTable | None) -> None:
        """Decide by `table` from now on (None: the GEMV for every shape it takes, no skinny GEMM)."""
        self.table = table
        self._rows_for.clear()
        self._config_for.clear()
        self._skinny_for.clear()

    def _config(self, x2: torch.Tensor, w: torch.Tensor):
        """The shipped launch configuration for this weight and batch, if the table names one that fits."""
        if self.table is None:
            return None
        bucket = self._gemv.m_bucket(x2.shape[0])
        key = (w.shape[0], w.shape[1], w.dtype, bucket)
        if key not in self._config_for:
            cfg = self.table.config_for(w.shape[0], w.shape[1], w.dtype, bucket)
            cfg = None if cfg is None else self._gemv.DenseGemvConfig.from_table(cfg)
            if cfg is not None and not self._gemv.fits(cfg, bucket):
                logger.warning(
                    "%s: the configuration for %s at %d rows does not fit; autotuning it instead",
                    self.table.source, key[:3], bucket,
                )  # fmt: skip
                cfg = None
            self._config_for[key] = cfg
        return self._config_for[key]

    def _takes(self, x2: torch.Tensor, w: torch.Tensor) -> bool:
        if not (x2.is_cuda and self._gemv.supported(x2, w)):
            return False
        if self.table is None:
            return True
        shape = (w.shape[0], w.shape[1], w.dtype)
        if shape not in self._rows_for:
            self._rows_for[shape] = self.table.rows_for(*shape)
        return x2.shape[0] <= self._rows_for[shape]

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if self._takes(x2, layer.weight):
            cfg = self._config(x2, layer.weight)
            y = self._gemv.dense_gemv(
                x2, layer.weight, bias, config=cfg, arrivals=self._gemv_arrivals(x2, layer.weight, cfg)
            )
        elif bias is None and (skinny := self._skinny_config(x2, layer.weight)) is not None:
            arrivals = self._arrivals_for(x2, layer.weight, skinny)
            y = self._skinny.skinny_gemm(x2, layer.weight, skinny, arrivals)
        else:
            return F.linear(x, layer.weight, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _skinny_config(self, x2: torch.Tensor, w: torch.Tensor):
        """The table's skinny-GEMM configuration for a batch of more rows than the GEMV takes (None: cuBLAS,
        which also keeps the smaller batches the GEMV's table leaves to it)."""
        if self.table is None or not self.table.skinny or x2.shape[0] <= self.max_rows:
            return None
        if not (x2.is_cuda and self._skinny.supported(x2, w)):
            return None
        key = (w.shape[0], w.shape[1], w.dtype, x2.shape[0])
        if key not in self._skinny_for:
            cfg = self.table.skinny_for(*key)
            self._skinny_for[key] = None if cfg is None else self._skinny.SkinnyGemmConfig(**cfg)
        return self._skinny_for[key]

    def _gemv_arrivals(self, x2: torch.Tensor, w: torch.Tensor, cfg) -> torch.Tensor | None:
        """The split-K GEMV's arrival counts (`kernels/graph_scratch.py`), shared by every layer; how many a
        shape and configuration need is worked out once."""
        key = (w.shape[0], cfg)
        if key not in self._tiles_for:
            self._tiles_for[key] = self._gemv.arrival_tiles(w.shape[0], x2.device, cfg)
        need = self._tiles_for[key]
        return self._arrivals.at_least(need, x2.device) if need else None

    def _arrivals_for(self, x2: torch.Tensor, w: torch.Tensor, cfg) -> torch.Tensor | None:
        """The split skinny GEMM's arrival counts (`kernels/graph_scratch.py`), shared by every layer."""
        if cfg.split_k <= 1:
            return None
        return self._arrivals.at_least(self._skinny.tiles(x2.shape[0], w.shape[0], cfg), x2.device)

    def logits(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or not self._takes(x, layer.weight):
            return super().logits(layer, x)
        cfg = self._config(x, layer.weight)
        return self._gemv.dense_gemv(
            x,
            layer.weight,
            None,
            torch.float32,
            config=cfg,
            arrivals=self._gemv_arrivals(x, layer.weight, cfg),
        )


def _make_triton(device: torch.device) -> Unquantized:
    require_triton(FLAG, device)
    return TritonGemv()


DENSE_GEMV_BACKENDS: dict[str, Callable[[torch.device], Unquantized]] = {
    "torch": lambda device: UNQUANTIZED,
    "triton": _make_triton,
}
CHOICES = ("auto", *DENSE_GEMV_BACKENDS)


def _device_table(device: torch.device) -> DenseGemvTable:
    """The tuned table of this CUDA device (empty on other devices or without a shipped file)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return DenseGemvTable()
    return table_for_device(torch.cuda.get_device_name(device))


def resolve_dense_gemv_backend(name: str | None, device: torch.device | str) -> str:
    """The backend `name` stands for on `device` ("auto": triton where the GPU has a tuned table)."""
    device = torch.device(device)
    return resolve_choice(FLAG, name, CHOICES, lambda: "triton" if _device_table(device) else "torch")


def use_dense_multiply(model: nn.Module, quant: Unquantized) -> int:
    """Give every plain linear layer and LM head of `model` the multiply `quant` (FP8 layers keep their
    own); returns how many."""
    layers = [m for m in model.modules() if isinstance(m, (LinearBase, LMHead)) and m.quant is UNQUANTIZED]
    for layer in layers:
        layer.quant = quant
    return len(layers)


def apply_dense_gemv_backend(model: nn.Module, name: str | None, device: torch.device | str) -> str:
    """Hand the dense layers of `model` the chosen backend's multiply; returns the backend's name."""
    device = torch.device(device)
    resolved = resolve_dense_gemv_backend(name, device)
    quant = DENSE_GEMV_BACKENDS[resolved](device)
    if isinstance(quant, TritonGemv):
        if (name or "auto") == "auto":  # the tuned table's shapes only
            quant.use_table(_device_table(device))
        n = use_dense_multiply(model, quant)
        where = f"the shapes {quant.table.source} names" if quant.table is not None else "every shape"
        logger.info(
            "dense layers (%d): batches of 1-%d rows take the Triton GEMV for %s", n, quant.max_rows, where
        )
    return resolved
