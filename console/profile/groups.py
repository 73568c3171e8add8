"""Server groups: one fleet of several kinds of server, each `[groups.NAME]` table a variant of `[server]`.

    [server]                  # shared by every group
    device = "cpu"
    [groups.dense]            # ServerArgs keys override [server]; `replicas` overrides [fleet] replicas
    model = "demo"
    replicas = 2
    [groups.moe]
    model = "demo-moe"

Group G of fleet F runs the servers `F-G-0`, `F-G-1`, ...; its ports continue after the previous group's
(`base_port + port_stride * i` counted over the whole fleet), and so do the rendezvous ports and, when
`[fleet] gpus` is not given, the GPU ids. Without `[groups]` a profile resolves exactly as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from console.profile.replicas import ResolvedFleet, resolve_servers
from console.profile.toml import RawProfile, did_you_mean, not_a_table

GROUP_KEYS = {"replicas"}
# More GPU ids than any node has: later groups take theirs from the ids the earlier groups left.
_MAX_GPUS_PER_NODE = 64


@dataclasses.dataclass
class GroupRaw(RawProfile):
    """The raw profile one group resolves from: [server] with the group's keys on top.

    Errors about those keys point at `[groups.NAME] key` (its line), not at [server]."""

    group: str = ""
    overrides: frozenset[str] = frozenset()

    def error(self, table: str, key: str, message: str):
        if table == "server" and key in self.overrides:
            table = f"groups.{self.group}"
        return super().error(table, key, message)


def _groups(raw: RawProfile) -> dict[str, dict]:
    groups = raw.data.get("groups", {})
    if not isinstance(groups, dict):
        raise raw.error("", "groups", "must be tables: [groups.NAME]")
    return groups


def check_groups(raw: RawProfile) -> None:
    """Shape of [groups]: each a table with a valid name and a replica count (ServerArgs keys are
    checked when the profile resolves, through the same parser as [server])."""
    from console.profile.server import FLEET_OWNED, known_keys

    keys = set(known_keys())
    for name, table in _groups(raw).items():
        if not isinstance(table, dict):
            more = "; `replicas` in it starts more servers of the group" if isinstance(table, list) else ""
            raise raw.error("groups", name, not_a_table(f"groups.{name}", table) + more)
        if not name.replace("-", "").replace("_", "").isalnum():
            raise raw.error("groups", name, "group names use letters, digits, - and _ only")
        where = f"groups.{name}"
        for key, value in table.items():
            if key == "replicas":
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise raw.error(where, key, f"must be an integer >= 1, got {value!r}")
            elif key in FLEET_OWNED:
                raise raw.error(where, key, f"is set per server by the fleet; use {FLEET_OWNED[key]}")
            elif key not in keys:
                hint = did_you_mean(key, [*keys, *GROUP_KEYS])
                raise raw.error(where, key, f"is not a ServerArgs field or `replicas`{hint}")


def group_raw(raw: RawProfile, name: str) -> GroupRaw:
    table = _groups(raw)[name]
    overrides = {k: v for k, v in table.items() if k not in GROUP_KEYS}
    data = {**raw.data, "server": {**raw.data.get("server", {}), **overrides}}
    return GroupRaw(data, raw.origin, raw.sources, group=name, overrides=frozenset(overrides))


def resolve_groups(profile, raw: RawProfile, platform: Any = None):
    """Resolve each group as a fleet of its own, one after the other, and join them."""
    check_groups(raw)
    fleet = profile.fleet
    stride = int(raw.data.get("fleet", {}).get("port_stride", 10))
    servers: list = []
    server_args: list = []
    given: list = []
    base_fields: tuple = ()
    used_gpus: set[int] = set()
    for name, table in _groups(raw).items():
        replicas = int(table.get("replicas", fleet.replicas))
        free = fleet.gpus if fleet.gpus is not None else tuple(range(_MAX_GPUS_PER_NODE))
        group_fleet = dataclasses.replace(
            fleet,
            name=f"{fleet.name}-{name}",
            replicas=replicas,
            base_port=fleet.base_port + stride * len(servers),
            dist_init_port=fleet.dist_init_port + 10 * len(servers),
            gpus=tuple(g for g in free if g not in used_gpus) if (used_gpus or fleet.gpus) else None,
        )
        resolved = resolve_servers(profile, group_raw(raw, name), group_fleet, platform)
        servers += resolved.servers
        server_args += resolved.server_args
        given += resolved.given_keys
        base_fields = base_fields or resolved.base_fields
        used_gpus.update(g for spec in resolved.servers for g in spec.gpus)
    return ResolvedFleet(profile, tuple(servers), tuple(server_args), base_fields, tuple(given))
