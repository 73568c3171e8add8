"""`--moe-backend`: the implementation that routes tokens and runs the experts of every MoE layer.

- `torch`: the reference (softmax/top-k in PyTorch; experts as a loop over the experts present in the
  batch, which waits on the device once per layer, so a decode step with it cannot be a CUDA graph);
  correct everywhere, the one used on the CPU.
- `triton`: one fused routing kernel (top-k, renormalisation, replica dispatch, load counting) and the
  fused experts (`moe/kernels/fused.py`; few-token steps take the CUDA-core GEMV `moe/kernels/gemv.py`
  only where the device's tuned table `moe/kernels/gemv_table.py` says so); needs a CUDA GPU, never waits
  on the host, so decode steps are captured whole.
- `auto` (the default): `triton` on CUDA when Triton imports, else `torch`.

The backend is chosen once from a registry of lazy factories, and each MoE block is handed the object
(`use_moe_backend`); nothing is patched into classes or modules. Seed choices this build does not
implement fail at start-up naming the available ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tokenspeed.runtime.kernels.graph_scratch import ArrivalCounts
from tokenspeed.runtime.layers.backend_choice import require_triton, resolve_choice, triton_available
from tokenspeed.runtime.layers.linear import LinearBase
from tokenspeed.runtime.layers.quantization.fp8 import ExpertScales
from tokenspeed.runtime.moe.dispatch import DispatchView, localize, torch_dispatch

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)
FLAG = "--moe-backend"
FUSED_ROUTE_ENV = "TOKENSPEED_MOE_FUSED_ROUTE"


class MoeBackend(Protocol):
    name: str

    def route(
        self,
        logits: torch.Tensor,
        top_k: int,
        renormalize: bool,
        dispatch: DispatchView | None = None,
        counts: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, E] logits -> (weights [T, k], expert ids [T, k]: local slots under EP, -1 for remote ones).

        `counts` (per physical slot) gains one per routed choice of a token whose `token_mask` is not 0."""
        ...

    def experts(
        self, module: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) with the stacked `module.w13` / `module.w2`."""
        ...

    def route_experts(
        self,
        module: nn.Module,
        x: torch.Tensor,
        logits: torch.Tensor,
        top_k: int,
        renormalize: bool,
        counts: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`experts` over `route`'s choice (no expert parallelism), in fewer launches where it can."""
        ...


def torch_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference routing: float32 softmax, top-k, optional renormalisation, weights in the logits' dtype."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


def count_routed(counts: torch.Tensor, ids: torch.Tensor, token_mask: torch.Tensor | None) -> None:
    """counts[slot] += 1 per routed choice of a live token, without a host sync."""
    flat = ids.reshape(-1).long()
    if token_mask is None:
        ones = torch.ones_like(flat, dtype=counts.dtype)
    else:
        live = (token_mask != 0).to(counts.dtype)
        ones = live.unsqueeze(-1).expand(ids.shape).reshape(-1)
    counts.index_add_(0, flat, ones)


def torch_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """Sum over (token, k) with ids >= 0 of weight * expert(x), one expert at a time (host sync).
    FP8 experts (`scales` given) are dequantized one expert at a time: the float32 reference."""
    out = torch.zeros_like(x)
    inter = w2.shape[-1]
    for expert in torch.unique(ids).tolist():
        if expert < 0:
            continue
        token_idx, slot = torch.where(ids == expert)
        w13_e, w2_e = w13[expert], w2[expert]
        if scales is not None:
            w13_e, w2_e = scales.dequantize(expert, w13_e, w2_e, x.dtype)
        gate_up = F.linear(x[token_idx], w13_e)
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(h, w2_e) * weights[token_idx, slot, None].to(h.dtype)
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


class TorchMoe:
    name = "torch"

    def route(self, logits, top_k, renormalize, dispatch=None, counts=None, token_mask=None):
        weights, ids = torch_topk(logits, top_k, renormalize)
        if dispatch is not None:
            ids = torch_dispatch(dispatch, ids)
        if counts is not None:
            count_routed(counts, ids, token_mask)
        if dispatch is not None:
            ids = localize(dispatch, ids)
        return weights, ids

    def experts(self, module, x, weights, ids):
        return torch_experts(x, module.w13, module.w2, weights, ids, ExpertScales.of(module))

    def route_experts(self, module, x, logits, top_k, renormalize, counts=None, token_mask=None):
        weights, ids = self.route(logits, top_k, renormalize, None, counts, token_mask)
        return self.experts(module, x, weights, ids)


class TritonMoe:
    """The fused kernels; block sizes from `moe/kernels/configs.py`'s table for this GPU."""

    name = "triton"

    def __init__(self, device: torch.device):
        from tokenspeed.runtime.moe.kernels import configs, fused, gemv, gemv_table, routing

        self._fused = fused.fused_experts
        self._gemv = gemv.moe_gemv
        self._route = routing.fused_route
        self._pick = configs.pick
        name = torch.cuda.get_device_name(device)
        self.table = configs.table_for(name)
        # Few-token steps take the CUDA-core GEMV only where this device's tuned table (or
        # TOKENSPEED_MOE_GEMV) says so: the tensor-core path stays the default until measured otherwise.
        self.gemv_table = gemv_table.table_for_device(name, os.environ)
        if self.gemv_table.shapes or self.gemv_table.force_all:
            logger.info("MoE GEMV table for few-token steps: %s", self.gemv_table.source)
        self._routing = gemv.Routing
        self._gemv_routed = gemv.moe_gemv_routed
        self._arrival_tiles = gemv.arrival_tiles
        # Where the GEMV runs a step, its first launch may route too (one launch fewer a layer); off until
        # timed on the device (TOKENSPEED_MOE_FUSED_ROUTE=1, benchmarks/decode_ab.py's `route`).
        self.fuse_route = os.environ.get(FUSED_ROUTE_ENV, "0") == "1"
        self._arrivals = ArrivalCounts("the MoE GEMV")

    def route(self, logits, top_k, renormalize, dispatch=None, counts=None, token_mask=None):
        if not logits.is_cuda:
            return TorchMoe().route(logits, top_k, renormalize, dispatch, counts, token_mask)
        return self._route(logits, top_k, renormalize, dispatch, counts, token_mask)

    def experts(self, module, x, weights, ids):
        scales = ExpertScales.of(module)
        if not x.is_cuda:
            return torch_experts(x, module.w13, module.w2, weights, ids, scales)
        # FP8 experts: the fused kernels read e4m3 and apply the scales per K tile
        w13, w2 = module.w13, module.w2
        cfg = self.gemv_table.pick(w2.shape[0], w2.shape[2], w2.shape[1], w13.dtype, x.shape[0])
        if cfg is not None:
            arrivals = self._arrivals_for(x, cfg, ids.shape[1], w2.shape[2])
            return self._gemv(x, w13, w2, weights, ids, cfg, scales, arrivals=arrivals)
        return self._fused(x, w13, w2, weights, ids, self._pick(self.table, x.shape[0]), scales)

    def _arrivals_for(self, x: torch.Tensor, cfg, top_k: int, inter: int) -> torch.Tensor | None:
        """The GEMV's split arrival counts (`kernels/graph_scratch.py`), shared by every layer."""
        need = self._arrival_tiles(x.shape[0], top_k, inter, x.shape[1], cfg)
        return self._arrivals.at_least(need, x.device) if need else None

    def route_experts(self, module, x, logits, top_k, renormalize, counts=None, token_mask=None):
        w13, w2 = module.w13, module.w2
        cfg = None
        if self.fuse_route and x.is_cuda:
            cfg = self.gemv_table.pick(w2.shape[0], w2.shape[2], w2.shape[1], w13.dtype, x.shape[0])
        if cfg is None:
            weights, ids = self.route(logits, top_k, renormalize, None, counts, token_mask)
            return self.experts(module, x, weights, ids)
        routing = self._routing(logits, top_k, renormalize, counts, token_mask)
        arrivals = self._arrivals_for(x, cfg, top_k, w2.shape[2])
        return self._gemv_routed(x, w13, w2, routing, cfg, ExpertScales.of(module), arrivals)[0]


class UsesMoeBackend(nn.Module):
    """A MoE block: holds the backend its forward routes and runs experts with (torch until told). A block
    has its router linear `gate` and `routed(x, logits, fb)`: its output for tokens `x` whose router logits
    are `logits`."""

    gate: LinearBase
    routed: Callable[[torch.Tensor, torch.Tensor, ForwardBatch | None], torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.backend: MoeBackend = TorchMoe()

    def use_moe_backend(self, backend: MoeBackend, device: torch.device) -> None:
        """Run on `device` with `backend` (called once the model is loaded, before any forward)."""
        self.backend = backend

    def forward(self, x: torch.Tensor, fb: ForwardBatch | None = None) -> torch.Tensor:
        return self.routed(x, self.gate(x), fb)


def _make_triton(device: torch.device) -> MoeBackend:
    require_triton(FLAG, device)
    return TritonMoe(device)


MOE_BACKENDS: dict[str, Callable[[torch.device], MoeBackend]] = {
    "torch": lambda device: TorchMoe(),
    "triton": _make_triton,
}
CHOICES = ("auto", *MOE_BACKENDS)


def resolve_moe_backend(name: str | None, device: torch.device | str) -> str:
    """The backend `name` stands for on `device` ("auto": triton on CUDA when it imports, else torch)."""
    cuda = torch.device(device).type == "cuda"
    return resolve_choice(FLAG, name, CHOICES, lambda: "triton" if cuda and triton_available() else "torch")


def create_moe_backend(name: str | None, device: torch.device | str) -> MoeBackend:
    return MOE_BACKENDS[resolve_moe_backend(name, device)](torch.device(device))


def apply_moe_backend(model: nn.Module, name: str | None, device: torch.device | str) -> MoeBackend:
    """Hand every MoE block of `model` the chosen backend; returns it."""
    device = torch.device(device)
    backend = create_moe_backend(name, device)
    blocks = [m for m in model.modules() if isinstance(m, UsesMoeBackend)]
    for block in blocks:
        block.use_moe_backend(backend, device)
    if blocks:
        logger.info("MoE layers (%d): routing and experts on the %s backend", len(blocks), backend.name)
    return backend
