"""The supervisor applies the plan: each server starts with its planned flags, and a restart is re-planned
against the GPUs as they are then.

    plans = FleetPlans(resolved, paths)           # probe + plan once, at start (own running servers counted free)
    launcher = PlannedLauncher(inner, plans)      # start(): argv + plan.planned_flags; a restart re-plans first

A restart whose GPU has less free memory than its plan (another process took some) is re-planned and the
change logged in the server's log; when the new plan does not fit, the start is refused with the reason
(`PlanRefused`: the server goes FATAL with it, rather than crash-looping into an out-of-memory error).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from console.gpu_owners import FleetProcesses, GpuOwners, attribute, other_fleets, own_mib_by_gpu
from console.launchers.base import Launcher, ProcessHandle
from console.probe import Probe, probe_gpus
from console.profile.plan import FleetPlan, ServerPlan, plan_fleet
from console.profile.schema import ProcessSpec, ServerSpec
from console.supervisor.logfile import append_line
from tokenspeed.config.resolution_check import expected_env

log = logging.getLogger("tokenspeed.supervisor")

# A restart that does not fit is probed again a few times before it is refused.
_REFUSE_AFTER_PROBES = 3
_PROBE_INTERVAL_S = 0.5
# A restart re-planned to fewer KV tokens than this share of its plan is worth a line in the log.
_REPLAN_TOLERANCE = 0.99


class PlanRefused(RuntimeError):
    """The server's plan does not fit the GPUs as they are now; starting it would only fail."""


@dataclasses.dataclass(frozen=True)
class GpuView:
    """What the GPU screen shows: the readings, whose memory is where, and the plan of a restart now."""

    probe: Probe
    owners: list[GpuOwners]
    plan: FleetPlan | None
    error: str | None

    def to_dict(self) -> dict:
        return {
            "probe": self.probe.to_dict(),
            "owners": [o.to_dict() for o in self.owners],
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "error": self.error,
        }


class FleetPlans:
    """The plan each server was last started with, and how to plan again."""

    def __init__(self, resolved, state_dir: Path, own: FleetProcesses | None = None, platform: Any = None):
        """`resolved`: the fleet as resolved for this machine's GPUs (the daemon's one resolution, against
        `platform`)."""
        self.resolved = resolved
        self.state_dir = state_dir
        self.platform = platform
        plan = self.plan_now(own).plan
        self.current: dict[str, ServerPlan] = {s.name: s for s in plan.servers} if plan else {}
        self.initial = plan
        for server in self.current.values():
            if server.device != "cpu":
                log.info(
                    "plan %s: %s; gpu_memory_utilization %s, KV tokens %s, CUDA graphs %s; adds %s",
                    server.name,
                    "fits" if server.fits else f"does not fit ({server.reason})",
                    server.gpu_memory_utilization,
                    server.kv_tokens,
                    server.max_cudagraph_capture_size,
                    " ".join(server.planned_flags) or "nothing",
                )

    def view(self, own: FleetProcesses | None) -> GpuView:
        return self.plan_now(own)

    def plan_now(self, own: FleetProcesses | None) -> GpuView:
        """Probe, attribute and plan; `own` is the fleet's live servers (their memory counts as free)."""
        probe = probe_gpus()
        own = own or FleetProcesses(self.resolved.profile.fleet.name, {})
        owners = attribute(probe, own, other_fleets(self.state_dir))
        try:
            running = bool(own.servers)
            plan = plan_fleet(self.resolved, probe, own_mib=own_mib_by_gpu(owners), running=running)
            return GpuView(probe, owners, plan, None)
        except (ValueError, OSError) as exc:
            return GpuView(probe, owners, None, str(exc))

    def planned(self, name: str) -> ServerPlan | None:
        return self.current.get(name)

    def expected(self, name: str, fields: dict[str, Any]):
        """The ServerArgs a process of server `name` resolves to with `fields` on top (plan, node rank)."""
        index = next((i for i, spec in enumerate(self.resolved.servers) if spec.name == name), None)
        if index is None:
            return None
        return dataclasses.replace(self.resolved.server_args[index], platform=self.platform, **fields)

    def replan(self, name: str, own: FleetProcesses | None, log_path: Path) -> ServerPlan | None:
        """The plan of a restart of `name` now; refuses (PlanRefused) when it does not fit."""
        for attempt in range(_REFUSE_AFTER_PROBES):
            if attempt:
                # The server's previous processes may still be giving their memory back to the driver.
                time.sleep(_PROBE_INTERVAL_S)
            view = self.plan_now(own)
            new = view.plan.server(name) if view.plan is not None else None
            if new is None or new.fits:
                break
        old = self.current.get(name)
        if new is None:
            return old
        if not new.fits:
            raise PlanRefused(f"the plan does not fit the GPUs now: {new.reason}")
        if old is not None and old.kv_tokens and new.kv_tokens is not None:
            if new.kv_tokens < old.kv_tokens * _REPLAN_TOLERANCE:
                message = (
                    f"re-planned: GPU {new.gpus} has {new.free_gib:.1f} GiB free (planned with "
                    f"{old.free_gib:.1f} GiB): KV tokens {old.kv_tokens} -> {new.kv_tokens}"
                )
                log.warning("%s: %s", name, message)
                append_line(log_path, f"[supervisor {time.strftime('%Y-%m-%d %H:%M:%S')}] {name}: {message}")
        self.current[name] = new
        return new


class PlannedLauncher(Launcher):
    """A launcher that puts each server's planned flags on its command line, re-planning restarts."""

    def __init__(self, inner: Launcher, plans: FleetPlans, own: Callable[[], FleetProcesses]):
        super().__init__(inner.command)
        self.inner = inner
        self.plans = plans
        self.own = own  # () -> FleetProcesses of the fleet's servers running now
        self._started: set[str] = set()

    def start(self, server: ServerSpec, process: ProcessSpec, log_path: Path) -> ProcessHandle:
        plan = self.plans.planned(server.name)
        if process.node_rank == 0 and (server.name in self._started or (plan is not None and not plan.fits)):
            # A restart, or a start the last plan refused: plan against the GPUs as they are now.
            plan = self.plans.replan(server.name, self.own(), log_path)
        self._started.add(server.name)
        planned = plan.planned_fields if plan is not None else {}
        if planned:
            process = process.with_fields(planned)
        # What the supervisor resolved for this process: its server logs any field it resolves otherwise.
        expected = self.plans.expected(server.name, {**planned, "node_rank": process.node_rank})
        if expected is not None:
            process = dataclasses.replace(process, env=(*process.env, *expected_env(expected).items()))
        return self.inner.start(server, process, log_path)

    def adopt(self, server: ServerSpec, process: ProcessSpec, record: dict, log_path: Path):
        handle = self.inner.adopt(server, process, record, log_path)
        if handle is not None:
            self._started.add(server.name)  # its next start is a restart
        return handle

    def poll_logs(self) -> None:
        self.inner.poll_logs()

    def tend_log_pumps(self) -> None:
        self.inner.tend_log_pumps()

    def close(self) -> None:
        self.inner.close()
