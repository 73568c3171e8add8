"""Profiles: a TOML file -> a checked `Profile` -> one `ServerSpec` (and `ServerArgs`) per server.

    profile = load_profile("profiles/demo.toml")      # ProfileError (file:line: key: why) on any mistake
    resolved = resolve_profile(profile)               # ResolvedFleet: specs + ServerArgs of each server

Replica i of fleet F is the server `F-i`. It listens on `base_port + port_stride * i`; with
`[server] nnodes = N` it spans N consecutive entries of `[fleet] nodes`, one `tokenspeed serve
--node-rank r` each, rendezvousing at `nodes[first]:dist_init_port + 10 * i`. GPUs are given to a
process through CUDA_VISIBLE_DEVICES (a run of `world_size / nnodes` ids from `[fleet] gpus`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.profile.groups import check_groups, resolve_groups
from console.profile.schema import (
    LAUNCHERS,
    RESTART_POLICIES,
    BackoffSpec,
    FleetSpec,
    HealthSpec,
    ProcessSpec,
    Profile,
    ServerSpec,
    SupervisorSpec,
)
from console.profile.server import resolve_server, server_fields
from console.profile.thresholds import parse_thresholds
from console.profile.toml import ProfileError, RawProfile, did_you_mean, read_profile
from console.supervisor.load import parse_load
from tokenspeed.config.api_key import API_KEY_ENV, others_can_read

log = logging.getLogger("tokenspeed.profile")

__all__ = ["ProfileError", "ResolvedFleet", "load_profile", "resolve_profile", "load_and_resolve"]

_TOP_LEVEL = {"server", "fleet", "supervisor", "env", "groups", "load", "console"}
_FLEET_EXTRA = {"port_stride"}
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _coerce(raw: RawProfile, table: str, key: str, value, expected):
    """Check one TOML value against the dataclass field type it fills."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is tuple:
        if not isinstance(value, list):
            raise raw.error(table, key, f"expects a list, got {value!r}")
        return tuple(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise raw.error(table, key, f"expects {expected.__name__}, got {value!r}")
    return value


def _build(raw: RawProfile, table: str, cls, values: dict, extra: set[str] = frozenset(), nested=None):
    """A dataclass from a TOML table; unknown keys are errors with a suggestion."""
    nested = nested or {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key in extra:
            continue
        if key in nested:
            if not isinstance(value, dict):
                raise raw.error(table, key, f"must be a table: [{table}.{key}]")
            kwargs[key] = _build(raw, f"{table}.{key}", nested[key], value)
            continue
        if key not in fields:
            raise raw.error(table, key, f"is not a [{table}] key{did_you_mean(key, [*fields, *extra])}")
        expected = {"float": float, "int": int, "str": str}.get(str(fields[key].type).split(" ")[0], None)
        if expected is None:
            expected = tuple if "tuple" in str(fields[key].type) else None
        kwargs[key] = _coerce(raw, table, key, value, expected) if expected else value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING]
        key = missing[0] if missing else ""
        raise raw.error(table, key, f"is required ({exc})") from None


def _check_fleet(raw: RawProfile, fleet: FleetSpec) -> None:
    rules = [
        ("restart", fleet.restart in RESTART_POLICIES, f"must be one of {', '.join(RESTART_POLICIES)}"),
        ("launcher", fleet.launcher in LAUNCHERS, f"must be one of {', '.join(LAUNCHERS)}"),
        ("replicas", fleet.replicas >= 1, "must be at least 1"),
        ("nodes", len(fleet.nodes) >= 1, "needs at least one node address"),
        ("base_port", 1024 <= fleet.base_port <= 65000, "must be a port between 1024 and 65000"),
        ("max_restarts", fleet.max_restarts >= 0, "must be >= 0"),
        ("stop_timeout_s", fleet.stop_timeout_s > 0, "must be > 0"),
        ("name", fleet.name.replace("-", "").replace("_", "").isalnum(), "letters, digits, - and _ only"),
    ]
    for key, ok, message in rules:
        if not ok:
            value = getattr(fleet, key)
            hint = did_you_mean(str(value), RESTART_POLICIES + LAUNCHERS) if isinstance(value, str) else ""
            raise raw.error("fleet", key, f"{message}, got {value!r}{hint}")
    if fleet.gpus is not None and any(not isinstance(g, int) or g < 0 for g in fleet.gpus):
        raise raw.error("fleet", "gpus", f"must be a list of GPU ids (integers >= 0), got {list(fleet.gpus)}")
    if fleet.launcher == "local" and any(n not in _LOOPBACK for n in fleet.nodes):
        raise raw.error(
            "fleet", "nodes", 'the local launcher runs on this machine only; use launcher = "ray" for others'
        )


def load_profile(path: str | Path) -> Profile:
    raw = read_profile(path)
    for key in raw.data:
        if key not in _TOP_LEVEL:
            raise raw.error("", key, f"is not a profile table{did_you_mean(key, [*_TOP_LEVEL, 'extends'])}")
    fleet_table = raw.data.get("fleet", {})
    if "name" not in fleet_table:
        fleet_table = {**fleet_table, "name": Path(path).stem}
    nested = {"backoff": BackoffSpec, "health": HealthSpec}
    fleet = _build(raw, "fleet", FleetSpec, fleet_table, extra=_FLEET_EXTRA, nested=nested)
    _check_fleet(raw, fleet)
    supervisor_table = raw.data.get("supervisor", {})
    if not isinstance(supervisor_table, dict):
        raise raw.error("", "supervisor", "must be a table: [supervisor]")
    supervisor = _build(raw, "supervisor", SupervisorSpec, supervisor_table)
    if supervisor.unhealthy_restart_after_s < 0:
        raise raw.error(
            "supervisor",
            "unhealthy_restart_after_s",
            f"must be >= 0 (0 never restarts an UNHEALTHY server), got {supervisor.unhealthy_restart_after_s!r}",
        )
    check_groups(raw)  # [groups.NAME]: console.profile.groups
    parse_load(raw)  # [load]: console.supervisor.load
    parse_thresholds(raw)  # [console.thresholds]: console.profile.thresholds
    env = raw.data.get("env", {})
    for key, value in env.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise raw.error("env", key, f"must be a string or a number, got {value!r}")
    return Profile(
        path=Path(path).resolve(),
        server=dict(raw.data.get("server", {})),
        fleet=fleet,
        env={k: str(v) for k, v in env.items()},
        sources=tuple(raw.sources),
        supervisor=supervisor,
    )


@dataclass(frozen=True)
class ResolvedFleet:
    profile: Profile
    servers: tuple[ServerSpec, ...]
    server_args: tuple[Any, ...]  # ServerArgs of each server (node rank 0), same order as servers
    base_fields: tuple[tuple[str, Any], ...]  # the ServerArgs fields [server] sets
    # The [server] keys (with its group's) the profile sets for each server: the planner leaves them alone.
    given_keys: tuple[frozenset[str], ...] = ()


def _place(
    raw: RawProfile, fleet: FleetSpec, nnodes: int, per_node: int
) -> list[tuple[list[str], list[int]]]:
    """(nodes, GPU ids) of each replica. Without [fleet] gpus, replicas spread over node groups first."""
    groups = [list(fleet.nodes[g * nnodes : (g + 1) * nnodes]) for g in range(len(fleet.nodes) // nnodes)]
    if not groups:
        raise raw.error(
            "fleet", "nodes", f"lists {len(fleet.nodes)} node(s) but each replica spans nnodes={nnodes}"
        )
    placements = []
    for replica in range(fleet.replicas):
        if fleet.gpus is None:
            group, slot = replica % len(groups), replica // len(groups)
            gpus = list(range(slot * per_node, (slot + 1) * per_node))
        else:
            fit = len(fleet.gpus) // per_node if per_node else fleet.replicas
            if fit == 0:
                raise raw.error(
                    "fleet", "gpus", f"gives {len(fleet.gpus)} GPU(s) per node; each replica needs {per_node}"
                )
            group, slot = replica // fit, replica % fit
            if group >= len(groups):
                raise raw.error(
                    "fleet",
                    "replicas",
                    f"{fleet.replicas} replicas of {per_node} GPU(s) x {nnodes} node(s) do not fit on "
                    f"{len(fleet.nodes)} node(s) with gpus = {list(fleet.gpus)}",
                )
            gpus = list(fleet.gpus[slot * per_node : (slot + 1) * per_node])
        placements.append((groups[group], gpus))
    return placements


def resolve_profile(profile: Profile, platform: Any = None) -> ResolvedFleet:
    """Every server of the fleet, each checked by resolving its ServerArgs like `tokenspeed serve` does."""
    raw = read_profile(profile.path)
    warn_readable_keys(raw)
    if raw.data.get("groups"):
        return resolve_groups(profile, raw, platform)
    return resolve_servers(profile, raw, profile.fleet, platform)


def resolve_servers(
    profile: Profile, raw: RawProfile, fleet: FleetSpec, platform: Any = None
) -> ResolvedFleet:
    """The servers of one group: `fleet` gives their count, name prefix and first port; `raw` their [server]."""
    fields = server_fields(_without_api_key(raw))
    secret = _api_key_env(raw, profile)
    # The key reaches each server through its environment; it is resolved here only to know it.
    key_field = {"api_key": secret[API_KEY_ENV]} if secret else {}
    stride = int(raw.data.get("fleet", {}).get("port_stride", 10))
    # Multi-node replicas and attention DP rendezvous at an explicit address; give each replica its own.
    needs_rendezvous = int(fields.get("nnodes") or 1) > 1 or int(fields.get("data_parallel_size") or 1) > 1

    def owned(nodes: list[str], replica: int) -> dict[str, Any]:
        """The fields the fleet sets for replica `replica` (a process adds its node rank)."""
        mine: dict[str, Any] = {
            "host": fleet.host,
            "port": fleet.base_port + stride * replica,
            "enable_metrics": True,
        }
        if needs_rendezvous:
            mine["dist_init_addr"] = f"{nodes[0]}:{fleet.dist_init_port + 10 * replica}"
        return mine

    resolved: dict[tuple, Any] = {}

    def resolve(replica: int, nodes: list[str]):
        """The server's ServerArgs, resolved once (with the key, which its command line leaves out).
        Replica 0's first node is the fleet's first node, so the resolution that sizes the fleet is it."""
        mine = owned(nodes, replica)
        key = tuple(sorted(mine.items()))
        if key not in resolved:
            resolved[key] = resolve_server(raw, fields, {**mine, **key_field}, platform)
        return resolved[key]

    first = resolve(0, list(fleet.nodes))
    nnodes = first.nnodes
    on_cpu = first.device == "cpu"
    world = first.mapping.world_size
    if world % nnodes:
        raise raw.error("server", "nnodes", f"world size {world} does not split over {nnodes} nodes")
    per_node = 0 if on_cpu else world // nnodes
    specs = []
    for replica, (nodes, gpus) in enumerate(_place(raw, fleet, nnodes, per_node)):
        common = {**fields, **owned(nodes, replica)}
        env = {**profile.env, **secret}
        if not on_cpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        processes = []
        for rank, node in enumerate(nodes):
            mine = {**common, "node_rank": rank} if nnodes > 1 else common
            processes.append(
                ProcessSpec(rank, node, tuple(gpus), tuple(mine.items()), tuple(sorted(env.items())))
            )
        port = common["port"]
        url_host = nodes[0] if fleet.host in ("0.0.0.0", "::") else fleet.host
        specs.append(ServerSpec(f"{fleet.name}-{replica}", replica, url_host, port, tuple(processes)))
    server_args = tuple(resolve(spec.replica, [p.node for p in spec.processes]) for spec in specs)
    given = (frozenset(raw.data.get("server", {})),) * len(specs)
    return ResolvedFleet(profile, tuple(specs), server_args, tuple(fields.items()), given)


def _without_api_key(raw: RawProfile) -> RawProfile:
    """`raw` less `[server] api_key`: a key on a command line is readable by every local user."""
    server = {k: v for k, v in raw.data.get("server", {}).items() if k != "api_key"}
    return dataclasses.replace(raw, data={**raw.data, "server": server})


def _api_key_env(raw: RawProfile, profile: Profile) -> dict[str, str]:
    """`{TOKENSPEED_API_KEY: key}` for the servers' environment: `[server] api_key`, else the same
    variable in `[env]`; empty when the profile sets no key."""
    key = raw.data.get("server", {}).get("api_key")
    if key is None:
        key = profile.env.get(API_KEY_ENV)
    elif not isinstance(key, str) or not key:
        raise raw.error("server", "api_key", f"expects a non-empty string, got {key!r}")
    return {API_KEY_ENV: key} if key else {}


def warn_readable_keys(raw: RawProfile) -> None:
    """A key in a profile file others can read is theirs too: said, once per file, not refused (a profile
    is also shared for its other settings; a key *file* others can read is refused everywhere)."""
    keyed: dict[Path, str] = {}
    for (table, key), path in raw.origin.items():
        if key in ("api_key", API_KEY_ENV):
            keyed.setdefault(Path(path), f"[{table}] {key}")
    for path, label in keyed.items():
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if not others_can_read(mode):
            continue
        log.warning(
            "warning: %s sets %s and is readable by group or others (mode %04o): they can read the API key; "
            "chmod 600 %s, or keep the key out of the profile (%s in the supervisor's environment)",
            path, label, mode & 0o777, path, API_KEY_ENV,
        )  # fmt: skip


def load_and_resolve(path: str | Path, platform: Any = None) -> ResolvedFleet:
    return resolve_profile(load_profile(path), platform)
