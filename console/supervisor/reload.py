"""What a profile reload changes: the running fleet against the profile as it is on disk now.

    change = diff_fleets(running, resolved_again)   # ReloadRefused: the reload cannot be applied as is
    change.to_json()                                 # per server: added / removed / changed (fields) / unchanged

Only servers whose own command line, environment or placement differ are restarted; a change to the
fleet's supervision settings (stop_timeout_s, health, backoff...) applies to the running servers without
a restart. Values of environment variables are never shown (one may hold the API key), only their names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from console.launchers.base import DEFAULT_COMMAND
from console.profile.schema import ServerSpec

ADDED, REMOVED, CHANGED, UNCHANGED = "added", "removed", "changed", "unchanged"
# [fleet] keys that a running supervisor cannot change: they name or place the whole fleet.
_FIXED_FLEET_KEYS = ("name", "launcher", "ray_address")


class ReloadRefused(ValueError):
    """The profile on disk cannot replace the running one; the fleet is left as it is."""


@dataclass(frozen=True)
class ServerChange:
    name: str
    change: str  # added | removed | changed | unchanged
    # field -> (before, after); env variables and placement appear as "env NAME", "node", "gpus", ...
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def describe(self) -> str:
        shown = ", ".join(f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in self.fields.items())
        return f"{self.name}: {self.change}" + (f" ({shown})" if shown else "")

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "change": self.change,
            "fields": {k: list(v) for k, v in self.fields.items()},
        }


@dataclass(frozen=True)
class FleetChange:
    servers: tuple[ServerChange, ...]
    fleet: dict[str, tuple[Any, Any]]  # [fleet] / [supervisor] settings that change without a restart

    def names(self, change: str) -> list[str]:
        return [s.name for s in self.servers if s.change == change]

    @property
    def empty(self) -> bool:
        return not self.fleet and all(s.change == UNCHANGED for s in self.servers)

    def message(self) -> str:
        """What applying it does, in one sentence an operator can act on."""
        if self.empty:
            return "the profile matches the running fleet: nothing to do"
        parts = []
        if changed := self.names(CHANGED):
            parts.append(
                f"restart {', '.join(changed)} one at a time (each drains its requests and is READY again "
                "before the next)"
            )
        if added := self.names(ADDED):
            parts.append(f"start {', '.join(added)}")
        if removed := self.names(REMOVED):
            parts.append(f"stop {', '.join(removed)} (draining first)")
        if self.fleet:
            parts.append("apply " + ", ".join(sorted(self.fleet)) + " without a restart")
        if unchanged := self.names(UNCHANGED):
            parts.append(f"leave {', '.join(unchanged)} running untouched")
        return "reload will " + "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "servers": [s.to_json() for s in self.servers],
            "fleet": {k: list(v) for k, v in self.fleet.items()},
            "restart": self.names(CHANGED),
            "start": self.names(ADDED),
            "stop": self.names(REMOVED),
            "message": self.message(),
        }


def _short(value: Any) -> str:
    text = "unset" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _server_view(spec: ServerSpec) -> dict[str, Any]:
    """Everything of a server that its processes are started with, as comparable values."""
    first = spec.processes[0]
    view: dict[str, Any] = {k: _comparable(v) for k, v in first.fields if k != "node_rank"}
    view["node"] = ",".join(p.node for p in spec.processes)
    view["gpus"] = list(first.gpus)
    for name, value in first.env:
        view[f"env {name}"] = value
    return view


def _comparable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def diff_server(old: ServerSpec, new: ServerSpec, command_changed: bool) -> ServerChange:
    before, after = _server_view(old), _server_view(new)
    fields = {}
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            # An environment value may be a secret: say that it changed, not what it is.
            fields[key] = ("...", "...") if key.startswith("env ") else (before.get(key), after.get(key))
    if command_changed:
        fields["command"] = ("...", "...")
    return ServerChange(new.name, CHANGED if fields else UNCHANGED, fields)


def _settings(resolved) -> dict[str, Any]:
    fleet = dataclasses.asdict(resolved.profile.fleet)
    out = {f"fleet.{k}": _comparable(v) for k, v in fleet.items() if k != "command"}
    out.update({f"supervisor.{k}": v for k, v in dataclasses.asdict(resolved.profile.supervisor).items()})
    return out


def diff_fleets(running, new) -> FleetChange:
    """The change from the running `ResolvedFleet` to `new`; ReloadRefused when it cannot be applied."""
    old_fleet, new_fleet = running.profile.fleet, new.profile.fleet
    for key in _FIXED_FLEET_KEYS:
        if getattr(old_fleet, key) != getattr(new_fleet, key):
            raise ReloadRefused(
                f"[fleet] {key} changed ({getattr(old_fleet, key)!r} -> {getattr(new_fleet, key)!r}): a running "
                f"fleet cannot change its {key}; put it back, or `tokenspeed down` and `tokenspeed up` again"
            )
    command_changed = old_fleet.command != new_fleet.command
    old = {s.name: s for s in running.servers}
    servers = []
    for spec in new.servers:
        if spec.name in old:
            servers.append(diff_server(old[spec.name], spec, command_changed))
        else:
            servers.append(ServerChange(spec.name, ADDED))
    servers += [ServerChange(name, REMOVED) for name in old if name not in {s.name for s in new.servers}]
    before, after = _settings(running), _settings(new)
    # Settings that only reach servers through their command line were compared per server above.
    skip = {f"fleet.{k}" for k in ("replicas", "base_port", "host", "nodes", "gpus", "dist_init_port")}
    settings = {
        k: (before.get(k), after.get(k))
        for k in sorted(set(before) | set(after))
        if k not in skip and before.get(k) != after.get(k)
    }
    return FleetChange(tuple(servers), settings)


def apply_change(sup, new, change: FleetChange) -> list:
    """Make `sup` (a Supervisor, on its loop) run `new`: settings at once, added servers started, removed
    ones stopped, changed ones handed back for a rolling restart (the units, in fleet order)."""
    import time

    now = time.time()
    sup.resolved = new
    sup.fleet = new.profile.fleet
    sup.plans.resolved = new
    command = tuple(new.profile.fleet.command) if new.profile.fleet.command else DEFAULT_COMMAND
    sup.launcher.command = sup.launcher.inner.command = command
    specs = {s.name: s for s in new.servers}
    args = {s.name: a for s, a in zip(new.servers, new.server_args, strict=True)}
    sup.monitor.args.update(args)
    for server in change.servers:
        if server.change == ADDED:
            sup.add_unit(specs[server.name], args[server.name]).start(now)
    for unit in sup.units.values():
        unit.configure(sup.fleet, new.profile.supervisor)
    changed = []
    for server in change.servers:
        unit = sup.units.get(server.name)
        if server.change == REMOVED and unit is not None:
            sup.retire(server.name)
        elif server.change == CHANGED and unit is not None:
            sup.auth[server.name] = sup.auth_for(args[server.name])
            unit.next_spec = specs[server.name]
            if unit.state.has_process and unit.want_running:
                changed.append(unit)
            else:
                unit.spec, unit.next_spec = specs[server.name], None  # its next start takes it
    return changed
