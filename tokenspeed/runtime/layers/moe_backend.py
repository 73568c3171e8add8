"""`--moe-backend`: which implementation runs the experts of MoE models.

`auto` and `torch` keep the reference experts (a loop over the experts present in the batch; correct
everywhere, but it waits on the device once per layer, so MoE decode runs without CUDA graphs). `triton`
switches every experts module to the fused Triton kernels (`kernels/fused_moe.py`), which need a CUDA
GPU and can be captured in CUDA graphs. Seed choices this build does not implement fail at start-up.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

MOE_BACKENDS = ("auto", "torch", "triton")


def apply_moe_backend(model: torch.nn.Module, name: str | None, device: torch.device | str) -> None:
    name = name or "auto"
    if name not in MOE_BACKENDS:
        raise ValueError(
            f"--moe-backend {name!r} is not available in this build; choose one of {', '.join(MOE_BACKENDS)}"
        )
    if name != "triton":
        return
    if torch.device(device).type != "cuda":
        raise ValueError("--moe-backend triton needs a CUDA GPU; use --moe-backend auto on the CPU")
    from tokenspeed.runtime.kernels.fused_moe import enable_fused_moe

    switched = enable_fused_moe(model)
    if switched:
        logger.info("MoE experts of %d layers run the fused Triton kernels", switched)
