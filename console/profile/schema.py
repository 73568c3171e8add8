"""The typed form of a profile's `[fleet]` table, and the servers a profile resolves to.

A profile file is TOML:

    extends = "base.toml"        # optional; this file's keys override the base's
    [server]                     # ServerArgs fields by their Python names (model, attn_tp_size, ...)
    [fleet]                      # the keys of FleetSpec below; [fleet.backoff] and [fleet.health] nest
    [supervisor]                 # the keys of SupervisorSpec: how the supervisor heals its servers
    [env]                        # environment of every server process

`console.profile.fleet` turns the file into these objects; the supervisor and the launchers read only these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.ranges import bounded

RESTART_POLICIES = ("always", "on-failure", "no")
LAUNCHERS = ("local", "ray")


@dataclass(frozen=True)
class BackoffSpec:
    initial_s: float = bounded(1.0, 0.0)
    max_s: float = bounded(60.0, 0.0)
    multiplier: float = bounded(2.0, 1.0)
    # A server that stayed up this long is healthy again: its next crash starts from initial_s.
    reset_after_s: float = bounded(60.0, 0.0)


@dataclass(frozen=True)
class HealthSpec:
    path: str = "/health"
    interval_s: float = bounded(5.0, 0.1)
    timeout_s: float = bounded(2.0, 0.1)
    failures: int = bounded(3, 1)  # consecutive failed checks before READY becomes UNHEALTHY


@dataclass(frozen=True)
class SupervisorSpec:
    # A server UNHEALTHY this long is restarted (stop, then the restart policy, reason "unhealthy" in its
    # last_exit): a hung process never heals on its own. 0 leaves UNHEALTHY servers alone.
    unhealthy_restart_after_s: float = bounded(60.0, 0.0, why="0 never restarts an UNHEALTHY server")
    # A READY server with requests in flight whose scheduler ran no step this long reads STALLED
    # (tokenspeed:scheduler_steps_total stands still). 0 turns the check off.
    stall_after_s: float = bounded(3.0, 0.0, why="0 turns the check off")


@dataclass(frozen=True)
class FleetSpec:
    name: str
    replicas: int = 1
    launcher: str = "local"
    host: str = "127.0.0.1"
    base_port: int = 30000
    # Node addresses; a replica whose [server] nnodes is N takes N consecutive nodes.
    nodes: tuple[str, ...] = ("127.0.0.1",)
    # GPU ids on each node that the fleet may use; None means every GPU the probe finds.
    gpus: tuple[int, ...] | None = None
    # Port of the torch.distributed rendezvous of multi-node replicas (replica i adds 10*i).
    dist_init_port: int = bounded(29500, 1024, 65000)
    # What starts a server process; its arguments follow. Default: this Python's `-m tokenspeed serve`.
    command: tuple[str, ...] | None = None
    # Ray cluster to join with launcher = "ray" (default: $RAY_ADDRESS, else the local cluster).
    ray_address: str | None = None
    restart: str = "on-failure"
    max_restarts: int = 5
    restart_window_s: float = bounded(300.0, 0.0)
    stop_timeout_s: float = 30.0
    # A server must answer its health check this soon after start, or the start counts as failed.
    startup_timeout_s: float = bounded(900.0, 1.0)
    log_max_bytes: int = bounded(50 * 1024 * 1024, 1024)
    log_backups: int = bounded(5, 0)
    metrics_interval_s: float = bounded(1.0, 0.1)
    history_seconds: float = bounded(3600.0, 0.0)
    backoff: BackoffSpec = field(default_factory=BackoffSpec)
    health: HealthSpec = field(default_factory=HealthSpec)


@dataclass(frozen=True)
class ProcessSpec:
    """One operating-system process of a server: its node rank, where it runs and how it starts."""

    node_rank: int
    node: str
    gpus: tuple[int, ...]
    # The ServerArgs fields its `tokenspeed serve` gets: the profile's [server], the fleet's own (host,
    # port, ...) and the plan's; spelled as a command line only when the process starts (`argv`).
    fields: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]

    @property
    def argv(self) -> tuple[str, ...]:
        """The arguments of its `tokenspeed serve`."""
        from tokenspeed.config.cli import to_argv

        return tuple(to_argv(dict(self.fields)))

    def with_fields(self, extra: dict[str, Any]) -> ProcessSpec:
        """The same process with `extra` fields added (the plan's)."""
        return dataclasses.replace(self, fields=(*self.fields, *extra.items()))


@dataclass(frozen=True)
class ServerSpec:
    """One server of the fleet: a replica, one `tokenspeed serve` per node it spans."""

    name: str
    replica: int
    host: str
    port: int
    processes: tuple[ProcessSpec, ...]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def node(self) -> str:
        return self.processes[0].node

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.processes[0].gpus


@dataclass(frozen=True)
class Profile:
    path: Path
    server: dict  # [server] as written (after extends), ServerArgs field name -> value
    fleet: FleetSpec
    env: dict[str, str]
    sources: tuple[Path, ...]  # this file and every file it extends
    supervisor: SupervisorSpec = field(default_factory=SupervisorSpec)
