"""Per-request values built on the host and sent to the device for a sampling step: pinned and copied
without blocking, so building a step's tensors never waits for the device."""

from __future__ import annotations

import torch


def _send(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` as a 1-D tensor of `dtype` on `device`."""
    return _send(torch.tensor(values, dtype=dtype), device)


def padded_ids(seqs: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """Token id lists as one int64 [len(seqs), longest (at least 1)] tensor on `device`, padded with `pad`."""
    width = max(1, max(len(s) for s in seqs))
    host = torch.full((len(seqs), width), pad, dtype=torch.int64)
    for i, s in enumerate(seqs):
        if s:
            host[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
    return _send(host, device)
