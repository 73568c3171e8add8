"""The servers of one fleet, or of one group of it: where each replica runs (nodes, GPU ids), its ports
and rendezvous address, its environment, and its ServerArgs resolved as `tokenspeed serve` would.

Below both fleet.py (a profile without [groups]) and groups.py (each group in turn, then joined).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from console.profile.schema import FleetSpec, ProcessSpec, Profile, ServerSpec
from console.profile.server import resolve_server, server_fields
from console.profile.toml import RawProfile
from tokenspeed.config.api_key import API_KEY_ENV


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
