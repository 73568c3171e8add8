"""Rank layout of one server: which global ranks form each communication group.

Three parts of a model are parallelised independently over the same ``world_size`` ranks:

- attention: tensor (tp), context (cp) and data (dp) parallel, ``tp * cp * dp == world_size``;
- dense (MLP) layers: tensor and data parallel, ``tp * dp == world_size``;
- MoE layers: tensor, expert (ep) and data parallel, ``tp * ep * dp == world_size``.

Invariant of the layout (drawn for attention; dense and MoE follow the same rule)::

    rank = (dp_index * cp_size + cp_index) * tp_size + tp_index

TP is the innermost axis so a TP group is a run of consecutive ranks, which sits on one node (and one
NVLink domain) whenever ``tp_size`` divides ``nprocs_per_node``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Protocol


class ParallelFields(Protocol):
    """The user-given size fields ``Mapping.from_server_args`` reads (a ``ServerArgs`` has them all).

    Declared here, not imported: the configuration holds a ``Mapping``, so this module stays below it."""

    world_size: int | None
    attn_tp_size: int | None
    data_parallel_size: int | None
    dense_tp_size: int | None
    moe_tp_size: int | None
    ep_size: int
    enable_expert_parallel: bool
    nprocs_per_node: int | None
    nnodes: int
    base_gpu_id: int
    gpu_id_step: int


GROUP_KINDS = ("attn_tp", "attn_cp", "attn_dp", "dense_tp", "dense_dp", "moe_tp", "moe_ep", "moe_dp")

# The flag an operator changes to fix each size, for error messages.
_FLAG_OF = {
    "world_size": "--world-size",
    "attn_tp_size": "--tp/--attn-tp-size",
    "attn_cp_size": "--tp (read as the CP size when ENABLE_CP=1)",
    "attn_dp_size": "--data-parallel-size",
    "dense_tp_size": "--dense-tp-size",
    "dense_dp_size": "--dense-tp-size (dense DP is world_size / dense TP)",
    "moe_tp_size": "--moe-tp-size",
    "moe_ep_size": "--ep-size/--expert-parallel-size",
    "moe_dp_size": "--moe-tp-size/--ep-size (MoE DP is what they leave of world_size)",
    "nprocs_per_node": "--nprocs-per-node",
    "nnodes": "--nnodes",
}


def env_enable_cp() -> bool:
    """Whether ``ENABLE_CP`` asks to read the attention TP size as a context-parallel size."""
    return os.environ.get("ENABLE_CP", "false").strip().lower() in ("true", "1")


def complete_sizes(total: int, sizes: list[tuple[str, int | None]]) -> list[int]:
    """Fill the unset (``None``) sizes so that their product is ``total``.

    The first unset size absorbs what the set ones leave; any further unset size is 1. The order of
    ``sizes`` is therefore the order of preference for taking up the remaining ranks.
    """
    for name, value in sizes:
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}; set {_FLAG_OF.get(name, name)} to >= 1")
    values = [value for _, value in sizes]
    missing = [i for i, value in enumerate(values) if value is None]
    for i in missing[1:]:
        values[i] = 1
    known = math.prod(v for v in values if v is not None)
    # Name only the sizes that constrain the product: the ones the caller set above 1.
    given = [(name, value) for name, value in sizes if value is not None and value > 1]
    described = " x ".join(f"{name}={value}" for name, value in given) or "1"
    given_flags = ", ".join(_FLAG_OF.get(name, name) for name, _ in given)
    flags = f"{given_flags} or --world-size" if given_flags else "--world-size"
    if missing:
        if total % known:
            raise ValueError(
                f"world_size={total} is not divisible by {described}; change {flags} so they divide it"
            )
        values[missing[0]] = total // known
    elif known != total:
        raise ValueError(
            f"{described} multiply to {known}, not world_size={total}; change {flags} "
            "so the product equals the world size"
        )
    return [int(v) for v in values]


def resolve_parallelism_sizes(
    world_size: int, attn_tp_size: int | None, attn_cp_size: int | None, attn_dp_size: int | None
) -> tuple[int, int, int]:
    """Attention (tp, cp, dp) sizes for ``world_size`` ranks; unset sizes are inferred.

    TP takes up the ranks first (dense layers always do TP), then CP, then DP: ``--world-size 8 --tp 2``
    gives dp=4, ``--world-size 8 --data-parallel-size 2`` gives tp=4.
    """
    tp, cp, dp = complete_sizes(
        world_size,
        [("attn_tp_size", attn_tp_size), ("attn_cp_size", attn_cp_size), ("attn_dp_size", attn_dp_size)],
    )
    return tp, cp, dp


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    """The sizes of one part of the model (attention, dense or MoE)."""

    tp_size: int
    dp_size: int
    cp_size: int = 1
    ep_size: int = 1

    @property
    def has_tp(self) -> bool:
        return self.tp_size > 1

    @property
    def has_cp(self) -> bool:
        return self.cp_size > 1

    @property
    def has_dp(self) -> bool:
        return self.dp_size > 1

    @property
    def has_ep(self) -> bool:
        return self.ep_size > 1


@dataclasses.dataclass(frozen=True)
class RankPlacement:
    """Where one global rank runs and its index inside each group kind."""

    rank: int
    node_rank: int
    local_rank: int
    gpu_id: int
    attn_tp_rank: int
    attn_cp_rank: int
    attn_dp_rank: int
    dense_tp_rank: int
    dense_dp_rank: int
    moe_tp_rank: int
    moe_ep_rank: int
    moe_dp_rank: int


def _axis_groups(world_size: int, dims: list[int], axis: int) -> list[list[int]]:
    """Groups along ``axis`` of a row-major layout whose first dim is innermost."""
    stride = math.prod(dims[:axis])
    size = dims[axis]
    groups = []
    for rank in range(world_size):
        if (rank // stride) % size == 0:
            groups.append([rank + j * stride for j in range(size)])
    return groups


def _coords(rank: int, dims: list[int]) -> list[int]:
    coords = []
    for size in dims:
        coords.append(rank % size)
        rank //= size
    return coords


@dataclasses.dataclass
class Mapping:
    """Sizes of every parallel dimension; unset sizes are completed and checked on construction."""

    world_size: int = 1
    attn_tp_size: int | None = None
    attn_cp_size: int | None = 1
    attn_dp_size: int | None = None
    dense_tp_size: int | None = None
    dense_dp_size: int | None = None
    moe_tp_size: int | None = None
    moe_ep_size: int | None = 1
    moe_dp_size: int | None = None
    nprocs_per_node: int | None = None
    nnodes: int = 1
    base_gpu_id: int = 0
    gpu_id_step: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}; fix --world-size or --tp")
        if self.nnodes is None or self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}; fix --nnodes")
        if self.base_gpu_id < 0:
            raise ValueError(f"base_gpu_id must be >= 0, got {self.base_gpu_id}; fix --base-gpu-id")
        if self.gpu_id_step < 1:
            raise ValueError(f"gpu_id_step must be >= 1, got {self.gpu_id_step}; fix --gpu-id-step")
        self.attn_tp_size, self.attn_cp_size, self.attn_dp_size = resolve_parallelism_sizes(
            self.world_size, self.attn_tp_size, self.attn_cp_size, self.attn_dp_size
        )
        self.dense_tp_size, self.dense_dp_size = complete_sizes(
            self.world_size, [("dense_tp_size", self.dense_tp_size), ("dense_dp_size", self.dense_dp_size)]
        )
        self.moe_tp_size, self.moe_ep_size, self.moe_dp_size = complete_sizes(
            self.world_size,
            [
                ("moe_tp_size", self.moe_tp_size),
                ("moe_ep_size", self.moe_ep_size),
                ("moe_dp_size", self.moe_dp_size),
            ],
        )
        if self.nprocs_per_node is None:
            if self.world_size % self.nnodes:
                raise ValueError(
                    f"world_size={self.world_size} cannot be split evenly over nnodes={self.nnodes}; "
                    "change --nnodes or the parallel sizes"
                )
            self.nprocs_per_node = self.world_size // self.nnodes
        elif self.nprocs_per_node < 1 or self.nprocs_per_node * self.nnodes != self.world_size:
            raise ValueError(
                f"nprocs_per_node={self.nprocs_per_node} x nnodes={self.nnodes} must equal "
                f"world_size={self.world_size}; fix --nprocs-per-node or --nnodes"
            )

    @classmethod
    def from_server_args(cls, args: ParallelFields, enable_cp: bool | None = None) -> Mapping:
        """The mapping a ``ServerArgs`` asks for, from its user-given (unresolved) size fields.

        ``enable_cp`` defaults to the ``ENABLE_CP`` environment variable, read now (not at import) so a
        launcher can set it per process.
        """
        if enable_cp is None:
            enable_cp = env_enable_cp()
        attn_tp, attn_cp, attn_dp = args.attn_tp_size, 1, args.data_parallel_size
        if enable_cp:
            attn_cp, attn_tp = attn_tp, 1
        world_size = args.world_size
        if world_size is None:
            world_size = math.prod(v for v in (attn_tp, attn_cp, attn_dp) if v is not None)
        ep_size = 1 if args.ep_size is None else args.ep_size
        if args.enable_expert_parallel and ep_size == 1:
            ep_size = world_size
        return cls(
            world_size=world_size,
            attn_tp_size=attn_tp,
            attn_cp_size=attn_cp,
            attn_dp_size=attn_dp,
            dense_tp_size=world_size if args.dense_tp_size is None else args.dense_tp_size,
            moe_tp_size=args.moe_tp_size,
            moe_ep_size=ep_size,
            nprocs_per_node=args.nprocs_per_node,
            nnodes=1 if args.nnodes is None else args.nnodes,
            base_gpu_id=args.base_gpu_id,
            gpu_id_step=args.gpu_id_step,
        )

    # Sizes by part ------------------------------------------------------------------------------------

    @property
    def attn(self) -> ParallelDims:
        return ParallelDims(tp_size=self.attn_tp_size, dp_size=self.attn_dp_size, cp_size=self.attn_cp_size)

    @property
    def dense(self) -> ParallelDims:
        return ParallelDims(tp_size=self.dense_tp_size, dp_size=self.dense_dp_size)

    @property
    def moe(self) -> ParallelDims:
        return ParallelDims(tp_size=self.moe_tp_size, dp_size=self.moe_dp_size, ep_size=self.moe_ep_size)

    # Groups -------------------------------------------------------------------------------------------

    def _layout(self, kind: str) -> tuple[list[int], int]:
        part, _, axis = kind.partition("_")
        layouts = {
            "attn": ([self.attn_tp_size, self.attn_cp_size, self.attn_dp_size], ["tp", "cp", "dp"]),
            "dense": ([self.dense_tp_size, self.dense_dp_size], ["tp", "dp"]),
            "moe": ([self.moe_tp_size, self.moe_ep_size, self.moe_dp_size], ["tp", "ep", "dp"]),
        }
        if kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {kind!r}; expected one of {', '.join(GROUP_KINDS)}")
        dims, axes = layouts[part]
        return dims, axes.index(axis)

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of ``kind`` (one of ``GROUP_KINDS``) as a list of global-rank lists."""
        dims, axis = self._layout(kind)
        return _axis_groups(self.world_size, dims, axis)

    def group_of(self, kind: str, rank: int) -> list[int]:
        """The ranks of the ``kind`` group that ``rank`` belongs to."""
        self._check_rank(rank)
        return next(g for g in self.groups(kind) if rank in g)

    def effective_group(self, kind: str, rank: int) -> list[int]:
        """The ranks a dense or MoE part really shards over: its own group when that lies inside the
        attention TP group, else the attention TP group (parts never shard across attention DP ranks,
        which run different batches). The memory model sizes weights with it."""
        group = self.group_of(kind, rank)
        inner = self.group_of("attn_tp", rank)
        return group if set(group) <= set(inner) else inner

    def all_groups(self) -> dict[str, list[list[int]]]:
        return {kind: self.groups(kind) for kind in GROUP_KINDS}

    # Placement ----------------------------------------------------------------------------------------

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")

    def node_of(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self.nprocs_per_node

    def local_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank % self.nprocs_per_node

    def gpu_id(self, rank: int) -> int:
        """The device index ``rank`` uses on its node (``--base-gpu-id`` + local rank x ``--gpu-id-step``)."""
        return self.base_gpu_id + self.local_rank(rank) * self.gpu_id_step

    def ranks_on_node(self, node_rank: int) -> list[int]:
        if not 0 <= node_rank < self.nnodes:
            raise ValueError(f"node_rank {node_rank} is outside 0..{self.nnodes - 1}; fix --node-rank")
        start = node_rank * self.nprocs_per_node
        return list(range(start, start + self.nprocs_per_node))

    def placement(self, rank: int) -> RankPlacement:
        self._check_rank(rank)
        # a rank's index in each group kind, innermost dimension first: RankPlacement's field order
        attn = _coords(rank, [self.attn_tp_size, self.attn_cp_size, self.attn_dp_size])
        dense = _coords(rank, [self.dense_tp_size, self.dense_dp_size])
        moe = _coords(rank, [self.moe_tp_size, self.moe_ep_size, self.moe_dp_size])
        where = (rank, self.node_of(rank), self.local_rank(rank), self.gpu_id(rank))
        return RankPlacement(*where, *attn, *dense, *moe)

    # Reporting ----------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Sizes, groups, per-rank placement and the log table, all JSON-serialisable."""
        return {
            **dataclasses.asdict(self),
            "groups": self.all_groups(),
            "ranks": [dataclasses.asdict(self.placement(r)) for r in range(self.world_size)],
            # Ready to show as is (the console's server view prints it).
            "table": self.table(),
        }

    def table(self) -> str:
        """A fixed-width summary for the log: sizes by part, then one row per rank."""
        lines = [
            f"world_size={self.world_size} nnodes={self.nnodes} nprocs_per_node={self.nprocs_per_node} "
            f"base_gpu_id={self.base_gpu_id} gpu_id_step={self.gpu_id_step}",
            f"{'part':<10}{'tp':>5}{'cp':>5}{'ep':>5}{'dp':>5}",
            f"{'attention':<10}{self.attn_tp_size:>5}{self.attn_cp_size:>5}{'-':>5}{self.attn_dp_size:>5}",
            f"{'dense':<10}{self.dense_tp_size:>5}{'-':>5}{'-':>5}{self.dense_dp_size:>5}",
            f"{'moe':<10}{self.moe_tp_size:>5}{'-':>5}{self.moe_ep_size:>5}{self.moe_dp_size:>5}",
            f"{'rank':>5}{'node':>5}{'gpu':>5}  {'attn tp/cp/dp':<14}{'dense tp/dp':<12}{'moe tp/ep/dp'}",
        ]
        for rank in range(self.world_size):
            p = self.placement(rank)
            attn = f"{p.attn_tp_rank}/{p.attn_cp_rank}/{p.attn_dp_rank}"
            dense = f"{p.dense_tp_rank}/{p.dense_dp_rank}"
            moe = f"{p.moe_tp_rank}/{p.moe_ep_rank}/{p.moe_dp_rank}"
            lines.append(f"{rank:>5}{p.node_rank:>5}{p.gpu_id:>5}  {attn:<14}{dense:<12}{moe}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
