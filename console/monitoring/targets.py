"""Prometheus file_sd targets of a fleet, kept by the supervisor in `<state_dir>/prometheus/`.

    servers.json     one target group per running server: its metrics address, labels fleet, server,
                     group, node, model, role="server"
    supervisor.json  the supervisor's own metrics address (a loopback port picked at start), role="supervisor"

Servers restart on new pids (and may move to new ports), so Prometheus follows these files instead of a
static list: each is rewritten atomically (write, fsync, rename) whenever what it lists changes, and
Prometheus' file watcher picks the new content up within a second. A stopped or crashed server leaves the
file until it runs again, so its series end instead of piling up failed scrapes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenspeed.config.server_args import ServerArgs

# States in which a server has a process that serves (or is about to serve) /metrics.
SCRAPED_STATES = ("STARTING", "READY", "UNHEALTHY")
DEFAULT_GROUP = "default"


@dataclass(frozen=True)
class TargetFiles:
    """Where one fleet's file_sd files live."""

    root: Path  # the fleet's state directory

    @property
    def directory(self) -> Path:
        return self.root / "prometheus"

    @property
    def servers(self) -> Path:
        return self.directory / "servers.json"

    @property
    def supervisor(self) -> Path:
        return self.directory / "supervisor.json"


@dataclass(frozen=True)
class ServerTarget:
    """What Prometheus needs to know about one server: where to scrape it and how to label it."""

    server: str
    address: str  # host:port of its HTTP front end (node rank 0)
    group: str
    node: str
    model: str

    def to_group(self, fleet: str) -> dict:
        labels = {
            "fleet": fleet,
            "server": self.server,
            "group": self.group,
            "node": self.node,
            "model": self.model,
            "role": "server",
        }
        return {"targets": [self.address], "labels": labels}


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def group_of(fleet: str, server: str) -> str:
    """The `[groups.NAME]` a server belongs to, from its name (`FLEET-GROUP-i`; `FLEET-i` without groups)."""
    middle = server.removeprefix(fleet + "-").rpartition("-")[0]
    return middle or DEFAULT_GROUP


def model_of(server_args: ServerArgs | None) -> str:
    """The served model name, as the server's own `model_name` label spells it ("" while not known)."""
    if server_args is None:
        return ""
    raw = server_args.served_model_name or str(server_args.model)
    return str(raw).split(",")[0].strip()


def server_targets(fleet: str, units: list[tuple[Any, Any, str]]) -> list[dict]:
    """file_sd groups of the servers that have a process; `units` holds (ServerSpec, ServerArgs, state)."""
    groups = []
    for spec, args, state in units:
        if state not in SCRAPED_STATES:
            continue
        target = ServerTarget(
            server=spec.name,
            address=host_port(spec.host, spec.port),
            group=group_of(fleet, spec.name),
            node=spec.node,
            model=model_of(args),
        )
        groups.append(target.to_group(fleet))
    return groups


def supervisor_targets(fleet: str, address: str | None) -> list[dict]:
    if address is None:
        return []
    return [{"targets": [address], "labels": {"fleet": fleet, "role": "supervisor"}}]


def render(groups: list[dict]) -> str:
    return json.dumps(groups, indent=1, sort_keys=True) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Prometheus must never read half a file: write a sibling, fsync, rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
