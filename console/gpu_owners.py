"""Whose memory is on each GPU: the processes NVML lists, matched to this fleet's servers, to the other
fleets supervised on this machine, or to nobody we know.

A server's GPU memory is held by its scheduler processes, children of the `tokenspeed serve` process the
supervisor started, so a server owns its root pids and all their descendants. Pids change when a
server restarts; the owners are taken from the supervisors' live records each time, never remembered.
NVML reports host pids: inside a container with its own pid namespace nothing matches and every
process shows as unknown.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from console.probe import Probe


@dataclass(frozen=True)
class FleetProcesses:
    """The root pids of each server of one fleet."""

    fleet: str
    servers: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class GpuOwners:
    """Memory on one GPU by owner (MiB): this fleet's servers, other fleets' servers ("fleet/server"),
    and processes no fleet claims (by pid)."""

    index: int
    own: dict[str, float] = field(default_factory=dict)
    other_fleets: dict[str, float] = field(default_factory=dict)
    unknown: dict[int, float] = field(default_factory=dict)

    @property
    def own_mib(self) -> float:
        return sum(self.own.values())

    def to_dict(self) -> dict:
        out = asdict(self)
        out["unknown"] = {str(pid): mib for pid, mib in self.unknown.items()}
        return out


def _family(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid, *(child.pid for child in root.children(recursive=True))}
    except psutil.Error:
        return set()


def pid_owners(fleet: FleetProcesses) -> dict[int, str]:
    """Every live pid of the fleet's servers (roots and descendants) -> the server's name."""
    owners: dict[int, str] = {}
    for server, roots in fleet.servers.items():
        for root in roots:
            owners.update(dict.fromkeys(_family(root), server))
    return owners


def attribute(probe: Probe, own: FleetProcesses, others: list[FleetProcesses] = ()) -> list[GpuOwners]:
    """Each GPU's processes by owner."""
    mine = pid_owners(own)
    theirs = {pid: f"{f.fleet}/{server}" for f in others for pid, server in pid_owners(f).items()}
    result = []
    for gpu in probe.gpus:
        owners = GpuOwners(gpu.index)
        for proc in gpu.processes:
            if proc.pid in mine:
                key = mine[proc.pid]
                owners.own[key] = owners.own.get(key, 0.0) + proc.used_mib
            elif proc.pid in theirs:
                key = theirs[proc.pid]
                owners.other_fleets[key] = owners.other_fleets.get(key, 0.0) + proc.used_mib
            else:
                owners.unknown[proc.pid] = owners.unknown.get(proc.pid, 0.0) + proc.used_mib
        result.append(owners)
    return result


def own_mib_by_gpu(owners: list[GpuOwners]) -> dict[int, float]:
    return {o.index: o.own_mib for o in owners if o.own_mib > 0}


def recorded_fleet(state_dir: Path) -> FleetProcesses | None:
    """A fleet's servers and their live root pids from its supervisor's state file (pid and start time
    checked, so a recycled pid is not taken for a server)."""
    from console.launchers.local import find_process

    try:
        state = json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None
    servers: dict[str, tuple[int, ...]] = {}
    for record in state.get("servers", []):
        pids = []
        for process in record.get("processes", []):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if find_process(int(process["pid"]), float(process["create_time"])) is not None:
                    pids.append(int(process["pid"]))
        if pids:
            servers[str(record.get("name"))] = tuple(pids)
    return FleetProcesses(str(state.get("fleet", state_dir.name)), servers) if servers else None


def other_fleets(own_state_dir: Path | None, root: Path | None = None) -> list[FleetProcesses]:
    """The fleets with live servers under the state root (default `$XDG_STATE_HOME/tokenspeed`), but
    the one kept in `own_state_dir`."""
    from console.supervisor.paths import state_root

    base = root or state_root()
    if not base.is_dir():
        return []
    own = own_state_dir.resolve() if own_state_dir else None
    found = []
    for directory in sorted(p for p in base.iterdir() if p.is_dir()):
        if own is not None and directory.resolve() == own:
            continue
        fleet = recorded_fleet(directory)
        if fleet is not None:
            found.append(fleet)
    return found
