"""Collectives over a `RankGroup`: no-ops for a group of one, so single-rank code runs unchanged.

Tensor collectives use the group's device communicator (NCCL on GPUs, gloo on the CPU). gloo has no
reduce-scatter, so there it is an all-reduce followed by taking this rank's slice.

`broadcast_object` sends a msgpack-able value (never pickle: a peer must not execute what it receives)
from the group's first rank over the gloo CPU communicator: length first, then the bytes.
"""

from __future__ import annotations

from typing import Any

import msgpack
import torch
import torch.distributed as dist

from tokenspeed.runtime.distributed.groups import RankGroup


def all_reduce(x: torch.Tensor, group: RankGroup) -> torch.Tensor:
    """Sum `x` over the group, in place; returns `x`."""
    if group.size > 1:
        dist.all_reduce(x, group=group.device_group)
    return x


def min_over_group(value: int, group: RankGroup) -> int:
    """The smallest of every rank's `value` (a host integer, over the CPU communicator)."""
    if group.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group.cpu_group)
    return int(t.item())


def all_gather(x: torch.Tensor, group: RankGroup, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` (same shape on all ranks) along `dim`, in rank order."""
    if group.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(group.size)]
    dist.all_gather(parts, x.contiguous(), group=group.device_group)
    return torch.cat(parts, dim=dim)


def reduce_scatter(x: torch.Tensor, group: RankGroup, dim: int = 0) -> torch.Tensor:
    """Sum over the group, keep this rank's 1/size slice along `dim` (which the size must divide)."""
    if group.size == 1:
        return x
    if x.shape[dim] % group.size:
        raise ValueError(f"reduce_scatter: dim {dim} of size {x.shape[dim]} does not split over {group.size}")
    if group.backend == "gloo":
        total = all_reduce(x.clone(), group)
        return total.chunk(group.size, dim=dim)[group.rank_in_group].contiguous()
    moved = x.movedim(dim, 0).contiguous()
    out = torch.empty((moved.shape[0] // group.size, *moved.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, moved, group=group.device_group)
    return out.movedim(0, dim)


def broadcast(x: torch.Tensor, group: RankGroup, src_index: int = 0) -> torch.Tensor:
    """Overwrite `x` on every rank with the `src_index`-th rank's, in place; returns `x`."""
    if group.size > 1:
        dist.broadcast(x, src=group.global_rank(src_index), group=group.device_group)
    return x


def broadcast_object(obj: Any, group: RankGroup) -> Any:
    """The first rank's `obj` on every rank of the group (msgpack-able values only).

    Peers pass anything (usually None) and get the first rank's value back.
    """
    if group.size == 1:
        return obj
    src = group.first_rank
    if group.is_first:
        payload = msgpack.packb(obj, use_bin_type=True)
        length = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(length, src=src, group=group.cpu_group)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.broadcast(data, src=src, group=group.cpu_group)
        return obj
    length = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(length, src=src, group=group.cpu_group)
    data = torch.empty(int(length.item()), dtype=torch.uint8)
    dist.broadcast(data, src=src, group=group.cpu_group)
    return msgpack.unpackb(data.numpy().tobytes(), raw=False, strict_map_key=False)


def barrier(group: RankGroup) -> None:
    if group.size > 1:
        dist.barrier(group=group.cpu_group)
