"""Live EPLB: every N steps, re-place the experts for the recorded load and move their weights.

Runs between two forward passes, on every rank of the EP group at the same step (rank 0 of the TP group
puts "rebalance" in the batch decision its peers follow), so no request sees a half-moved layer:

1. the recorder's window gives tokens per (layer, physical slot), summed per logical expert;
2. the EP group's first rank runs the EPLB algorithm and broadcasts the new physical -> logical map
   (every rank must apply the same one);
3. per MoE layer, each slot whose expert changes gets its new weights: from a slot of the same rank that
   held that expert, else from the first rank that held it (point-to-point send/recv, matched because
   every rank lists the transfers in the same order), written in place into the existing parameters;
   the source slots are read from a copy so a slot can be both a source and a destination;
4. the new location takes effect: the host placement is replaced and the device dispatch tables are
   rewritten in place, so CUDA graphs captured before stay valid (nothing is re-captured); the recorder
   window restarts. The time decoding stalled is logged and exported (`eplb_rebalance_seconds`).

The same `rebalance` runs every `--eplb-rebalance-num-iterations` steps with `--enable-eplb` (periodic)
and on demand (POST /rebalance_experts), which is the only trigger when EP or redundant experts are on
without `--enable-eplb`; it then needs a recorded load (a recording session, or
`--enable-expert-distribution-metrics`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tokenspeed.config.slices import KEPT_BY_EPLB
from tokenspeed.runtime.distributed.comm import broadcast_object
from tokenspeed.runtime.engine.io_struct import ControlRefused
from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.eplb_algorithm import balancedness, rank_loads, worse_layers
from tokenspeed.runtime.moe.expert_location import ExpertLocation
from tokenspeed.runtime.moe.expert_parallel import ExpertParallelState
from tokenspeed.runtime.moe.placement_view import placement_changes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transfer:
    layer: int
    dst_rank: int  # index in the EP group
    dst_local: int
    src_rank: int
    src_local: int


@dataclass
class RebalanceResult:
    """One rebalance; per-layer lists follow `layers` (the MoE layers). Plain values: it goes over msgpack."""

    balancedness_before: list[float]  # mean / max load per EP rank of the window's load, old placement
    balancedness_after: list[float]  # the same load on the new placement
    moved_slots: int
    seconds: float
    index: int = 0  # 1 for the server's first rebalance
    layers: list[int] = field(default_factory=list)
    tokens: int = 0  # routed (token, expert) choices in the window the placement was computed from
    passes: int = 0  # forward passes in that window
    moved_experts: list[list[int]] = field(default_factory=list)  # logical experts given a new slot
    replicas: list[list[list[int]]] = field(default_factory=list)  # [[expert, slots], ...] with slots > 1
    # per layer, [expert, EP ranks before, EP ranks after] of every expert whose ranks changed
    changes: list[list[list]] = field(default_factory=list)


@dataclass
class EPLBStats:
    rebalances: int = 0
    seconds: float = 0.0  # decoding stalled by all rebalances so far
    last: RebalanceResult | None = None
    history: list[RebalanceResult] = field(default_factory=list)


HOW_TO_ENABLE = (
    "rebalancing moves experts between expert-parallel slots: serve a MoE model with --ep-size N (N > 1) "
    "or --ep-num-redundant-experts R, and add --enable-eplb to also rebalance every "
    "--eplb-rebalance-num-iterations steps"
)


def rebalance_unavailable(moe_layers: list[int]) -> str:
    """Why a server without an EPLB manager cannot rebalance, and the flags that would let it."""
    if not moe_layers:
        return f"this model has no MoE layers, so there are no experts to rebalance ({HOW_TO_ENABLE})"
    return f"this server has no expert-parallel placement to change; {HOW_TO_ENABLE}"


def logical_counts(physical: torch.Tensor, phy2log: torch.Tensor, num_logical: int) -> torch.Tensor:
    """Tokens per (layer, logical expert) from tokens per (layer, physical slot)."""
    out = torch.zeros((physical.shape[0], num_logical), dtype=torch.float64)
    out.scatter_add_(1, phy2log.to(torch.int64), physical.to(torch.float64))
    return out


def moved_experts(old: torch.Tensor, new: torch.Tensor, layers: list[int]) -> list[list[int]]:
    """Per layer, the logical experts that landed in a slot that held another expert before."""
    changed = old[layers] != new[layers]
    return [sorted(set(new[layer][changed[i]].tolist())) for i, layer in enumerate(layers)]


def replica_summary(logcnt: torch.Tensor, layers: list[int]) -> list[list[list[int]]]:
    """Per layer, [expert, slots] of every expert with more than one slot, most replicated first."""
    out = []
    for layer in layers:
        row = logcnt[layer].tolist()
        many = sorted((e for e, n in enumerate(row) if n > 1), key=lambda e: (-row[e], e))
        out.append([[e, row[e]] for e in many])
    return out


def plan_transfers(
    old: torch.Tensor, new: torch.Tensor, slots_per_rank: int, layers: list[int]
) -> list[Transfer]:
    """Moves that turn placement `old` into `new` ([layers, physical] maps), the same list on every rank."""
    out = []
    for layer in layers:
        before, after = old[layer].tolist(), new[layer].tolist()
        for slot, expert in enumerate(after):
            if before[slot] == expert:
                continue
            dst_rank, dst_local = divmod(slot, slots_per_rank)
            holders = [s for s, e in enumerate(before) if e == expert]
            if not holders:
                raise RuntimeError(f"layer {layer}: no slot holds expert {expert} before the rebalance")
            same_rank = [s for s in holders if s // slots_per_rank == dst_rank]
            src = (same_rank or holders)[0]
            out.append(Transfer(layer, dst_rank, dst_local, *divmod(src, slots_per_rank)))
    return out


def moved_tensors(experts) -> list[torch.Tensor]:
    """What a transfer moves per slot: the stacked weights and, for FP8 experts, their scales; FP8 tensors
    as bytes (the collectives move bytes whatever the dtype, and gloo has no float8 type)."""
    tensors = [experts.w13, experts.w2]
    if getattr(experts, "w13_scale", None) is not None:
        tensors += [experts.w13_scale, experts.w2_scale]
    return [t.data.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.data for t in tensors]


def apply_transfers(state: ExpertParallelState, transfers: list[Transfer]) -> None:
    """Copy or send/receive the expert weights of every transfer (collective over the EP group).

    Weights move in place (`copy_` / `irecv` into the existing parameters), so CUDA graphs captured
    before the rebalance read the new experts; only the slots this rank sends from are copied aside
    first, so a slot can be both a source and a destination."""
    group = state.group
    me = group.rank_in_group
    by_layer: dict[int, list[Transfer]] = {}
    for t in transfers:
        by_layer.setdefault(t.layer, []).append(t)
    for layer, moves in by_layer.items():
        experts = state.layers[layer]
        params = moved_tensors(experts)
        sources = sorted({t.src_local for t in moves if t.src_rank == me})
        at = {slot: i for i, slot in enumerate(sources)}
        index = torch.tensor(sources, dtype=torch.long, device=experts.w13.device)
        old = [p.index_select(0, index) for p in params] if sources else []
        ops = []
        for i, t in enumerate(moves):
            for j, param in enumerate(params):
                tag = len(params) * i + j
                if t.dst_rank == me and t.src_rank == me:
                    param[t.dst_local].copy_(old[j][at[t.src_local]])
                elif t.dst_rank == me:
                    peer = group.global_rank(t.src_rank)
                    ops.append(dist.P2POp(dist.irecv, param[t.dst_local], peer, group.device_group, tag))
                elif t.src_rank == me:
                    peer = group.global_rank(t.dst_rank)
                    source = old[j][at[t.src_local]]
                    ops.append(dist.P2POp(dist.isend, source, peer, group.device_group, tag))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()


def _wait_for_device(state: ExpertParallelState) -> None:
    """Let the steps already queued finish, so the stall measured is the rebalance's own."""
    device = state.dispatch.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EPLBManager:
    """Rebalances one model's expert placement from its recorder, on demand or every N steps."""

    def __init__(
        self,
        state: ExpertParallelState,
        recorder: ExpertDistributionRecorder,
        num_redundant: int,
        rebalance_num_iterations: int = 1000,
        algorithm: str = "auto",
        num_nodes: int = 1,
        periodic: bool = True,
    ):
        if rebalance_num_iterations < 1:
            raise ValueError(f"--eplb-rebalance-num-iterations must be >= 1, got {rebalance_num_iterations}")
        if recorder.num_experts != state.location.num_physical:
            raise ValueError("the expert recorder must count physical slots of the expert location")
        self.state = state
        self.recorder = recorder
        self.num_redundant = num_redundant
        self.interval = rebalance_num_iterations
        self.algorithm = algorithm
        self.num_nodes = num_nodes
        self.periodic = periodic
        self.steps = 0
        self.stats = EPLBStats()
        if periodic:
            self.recorder.keep(KEPT_BY_EPLB)

    def step_done(self) -> bool:
        """Count a forward pass; True when the next one should be preceded by a rebalance."""
        self.steps += 1
        return self.periodic and self.steps % self.interval == 0

    def check_can_rebalance(self) -> None:
        """Raise ControlRefused when there is no recorded load to place experts for."""
        counts = self.recorder.window_counts()[self._moe_layers()]
        if int(counts.sum()) > 0:
            return
        since = "since the last rebalance" if self.stats.rebalances else "yet"
        how = (
            "recording is on: send some requests first"
            if self.recorder.recording
            else "start recording with POST /start_expert_distribution_record (or start the server with "
            "--enable-expert-distribution-metrics), send some requests"
        )
        raise ControlRefused(
            f"no expert load recorded {since}: {how}, then rebalance again", "nothing_recorded"
        )

    def _moe_layers(self) -> list[int]:
        return sorted(self.state.layers)

    def new_location(self, counts: torch.Tensor) -> ExpertLocation:
        """The EPLB placement for `counts` [layers, logical]; computed on the first rank, broadcast."""
        state = self.state
        loc = state.location
        phy2log = None
        if state.group.is_first:
            placed = ExpertLocation.from_counts(
                counts.float(), self.num_redundant, loc.ep_size, self.num_nodes, self.algorithm
            )
            phy2log = placed.placement.phy2log
            # layers without experts keep their rows (their counts are all zero), and so does a layer
            # the greedy placement would balance worse for this very load than its current one:
            # a rebalance never leaves a layer less balanced than it found it
            keep = torch.ones(phy2log.shape[0], dtype=torch.bool)
            keep[self._moe_layers()] = False
            keep |= worse_layers(counts, loc.placement, placed.placement, loc.ep_size)
            phy2log[keep] = loc.placement.phy2log[keep]
            phy2log = phy2log.tolist()
        phy2log = broadcast_object(phy2log, state.group)
        return ExpertLocation.from_phy2log(
            torch.tensor(phy2log, dtype=torch.int64), loc.num_logical, loc.ep_size
        )

    def rebalance(self) -> RebalanceResult:
        """Re-place and move the experts now, between two steps; `seconds` is how long decoding stalls
        (from here until the moved weights have landed on the device)."""
        state = self.state
        _wait_for_device(state)
        start = time.perf_counter()
        old = state.location
        passes = self.recorder.state.passes
        counts = logical_counts(self.recorder.window_counts(), old.placement.phy2log, old.num_logical)
        new = self.new_location(counts)
        transfers = plan_transfers(
            old.placement.phy2log, new.placement.phy2log, old.slots_per_rank, self._moe_layers()
        )
        apply_transfers(state, transfers)
        state.set_location(new)
        layers = self._moe_layers()
        before = balancedness(rank_loads(counts, old.placement, old.ep_size))[layers]
        after = balancedness(rank_loads(counts, new.placement, new.ep_size))[layers]
        self.recorder.reset()
        self.steps = 0  # the next periodic rebalance is a whole interval after this one
        _wait_for_device(state)
        result = RebalanceResult(
            balancedness_before=[round(float(x), 4) for x in before],
            balancedness_after=[round(float(x), 4) for x in after],
            moved_slots=len(transfers),
            seconds=time.perf_counter() - start,
            index=self.stats.rebalances + 1,
            layers=layers,
            tokens=int(counts[layers].sum()) if layers else 0,
            passes=passes,
            moved_experts=moved_experts(old.placement.phy2log, new.placement.phy2log, layers),
            replicas=replica_summary(new.placement.logcnt, layers),
            changes=placement_changes(
                old.placement.phy2log, new.placement.phy2log, old.slots_per_rank, old.num_logical, layers
            ),
        )
        self.stats.rebalances += 1
        self.stats.seconds += result.seconds
        self.stats.last = result
        self.stats.history = (self.stats.history + [result])[-16:]
        logger.info(
            "EPLB rebalance %d: moved %d expert slots in place, decoding stalled %.3fs, "
            "balancedness %.3f -> %.3f",
            self.stats.rebalances,
            result.moved_slots,
            result.seconds,
            float(before.mean()) if len(layers) else 1.0,
            float(after.mean()) if len(layers) else 1.0,
        )
        return result
