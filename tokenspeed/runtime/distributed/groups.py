"""torch.distributed groups of one rank, built once from the `Mapping` and passed to whoever needs them.

Every rank calls `init_parallel(mapping, rank, ...)` with the same mapping: torch.distributed requires
every process to create every group in the same order, even the groups it is not part of, so groups are
created for all ranks and each rank keeps the ones it belongs to. Identical rank lists (attention TP and
dense TP are usually the same ranks) share one communicator.

Each `RankGroup` carries two communicators: `device_group` for tensors on the model's device (NCCL on
GPUs, gloo on the CPU) and `cpu_group` (always gloo) for small host messages such as the batch decision
that rank 0 of a TP group broadcasts. A group of one rank has neither and every helper in `comm.py` is a
no-op for it, so a single-process server runs the same code without initialising torch.distributed.

Model parallel layers need the same tokens on every rank of their group. Attention DP ranks hold different
requests, so a dense or MoE group that reaches across attention DP ranks (the default `--dense-tp-size`
of a `--data-parallel-size 2` server) would mix batches: such a part runs inside the attention TP group
instead (`effective`), which is what DP without DP-attention means.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tokenspeed.runtime.distributed.mapping import GROUP_KINDS, Mapping

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankGroup:
    """One group this rank belongs to: its global ranks, this rank's index and the communicators."""

    kind: str
    ranks: tuple[int, ...]
    rank: int  # global rank of this process
    device_group: object = None  # torch ProcessGroup, None for a single rank
    cpu_group: object = None
    backend: str = "gloo"

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def is_first(self) -> bool:
        return self.rank_in_group == 0

    @property
    def first_rank(self) -> int:
        return self.ranks[0]

    def global_rank(self, index: int) -> int:
        return self.ranks[index]

    @classmethod
    def single(cls, kind: str, rank: int = 0) -> RankGroup:
        return cls(kind=kind, ranks=(rank,), rank=rank)


@dataclass(frozen=True)
class ParallelGroups:
    """Every group of one rank, by `GROUP_KINDS` name, plus the whole world."""

    mapping: Mapping
    rank: int
    world: RankGroup
    by_kind: dict[str, RankGroup] = field(default_factory=dict)

    def get(self, kind: str) -> RankGroup:
        if kind not in self.by_kind:
            raise ValueError(f"unknown group kind {kind!r}; expected one of {', '.join(GROUP_KINDS)}")
        return self.by_kind[kind]

    @property
    def attn_tp(self) -> RankGroup:
        return self.get("attn_tp")

    def effective(self, kind: str) -> RankGroup:
        """The group a dense or MoE part really uses: its own if inside the attention TP group."""
        group = self.get(kind)
        if list(group.ranks) == self.mapping.effective_group(kind, self.rank):
            return group
        return RankGroup(
            kind=kind,
            ranks=self.attn_tp.ranks,
            rank=self.rank,
            device_group=self.attn_tp.device_group,
            cpu_group=self.attn_tp.cpu_group,
            backend=self.attn_tp.backend,
        )

    @property
    def dense_tp(self) -> RankGroup:
        return self.effective("dense_tp")

    @property
    def moe_ep(self) -> RankGroup:
        """MoE EP inside the attention TP group; size 1 when the mapping has no EP."""
        if self.mapping.moe_ep_size == 1:
            return RankGroup.single("moe_ep", self.rank)
        return self.effective("moe_ep")

    @property
    def moe_tp(self) -> RankGroup:
        if self.mapping.moe_tp_size == 1:
            return RankGroup.single("moe_tp", self.rank)
        return self.effective("moe_tp")

    @classmethod
    def single_process(cls, mapping: Mapping | None = None) -> ParallelGroups:
        mapping = mapping or Mapping(world_size=1)
        if mapping.world_size != 1:
            raise ValueError("single_process groups need a world size of 1")
        return cls.local_only(mapping, 0)

    @classmethod
    def local_only(cls, mapping: Mapping, rank: int) -> ParallelGroups:
        """Every group of one rank: for ranks that never talk (attention DP without any TP)."""
        return cls(
            mapping=mapping,
            rank=rank,
            world=RankGroup.single("world", rank),
            by_kind={kind: RankGroup.single(kind, rank) for kind in GROUP_KINDS},
        )


def default_backend(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_parallel(
    mapping: Mapping,
    rank: int,
    init_method: str,
    device: torch.device | str = "cpu",
    timeout_s: float | None = None,
) -> ParallelGroups:
    """Join the world at `init_method` (``tcp://host:port``) and build every group of `mapping`."""
    if mapping.world_size == 1:
        return ParallelGroups.single_process(mapping)
    if mapping.attn_tp_size * mapping.attn_cp_size == 1:
        # attention-DP replicas of one rank each share nothing: no rendezvous, no communicator
        return ParallelGroups.local_only(mapping, rank)
    backend = default_backend(device)
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
    if not dist.is_initialized():
        kwargs = {"timeout": timeout} if timeout else {}
        if backend == "nccl":
            kwargs["device_id"] = torch.device(device)
        dist.init_process_group(
            backend=backend, init_method=init_method, world_size=mapping.world_size, rank=rank, **kwargs
        )
    return build_groups(mapping, rank, backend, timeout)


def build_groups(
    mapping: Mapping, rank: int, backend: str, timeout: datetime.timedelta | None = None
) -> ParallelGroups:
    """Create the communicators of every kind (collective: all ranks call it in the same order)."""
    cache: dict[tuple[int, ...], tuple[object, object]] = {}
    kwargs = {"timeout": timeout} if timeout else {}

    def communicators(ranks: tuple[int, ...]) -> tuple[object, object]:
        if ranks not in cache:
            if len(ranks) == 1:
                cache[ranks] = (None, None)
            else:
                device_group = dist.new_group(list(ranks), backend=backend, **kwargs)
                cpu_group = (
                    device_group
                    if backend == "gloo"
                    else dist.new_group(list(ranks), backend="gloo", **kwargs)
                )
                cache[ranks] = (device_group, cpu_group)
        return cache[ranks]

    world_ranks = tuple(range(mapping.world_size))
    by_kind: dict[str, RankGroup] = {}
    for kind in GROUP_KINDS:
        for ranks in mapping.groups(kind):
            ranks_t = tuple(ranks)
            device_group, cpu_group = communicators(ranks_t)
            if rank in ranks_t:
                by_kind[kind] = RankGroup(kind, ranks_t, rank, device_group, cpu_group, backend)
    device_group, cpu_group = communicators(world_ranks)
    world = RankGroup("world", world_ranks, rank, device_group, cpu_group, backend)
    return ParallelGroups(mapping=mapping, rank=rank, world=world, by_kind=by_kind)


def shutdown_parallel(groups: ParallelGroups | None) -> None:
    if groups is not None and groups.mapping.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
