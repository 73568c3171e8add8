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
from pathlib import Path
from typing import Any

from console.profile.groups import check_groups, resolve_groups
from console.profile.replicas import ResolvedFleet, resolve_servers
from console.profile.schema import (
    LAUNCHERS,
    RESTART_POLICIES,
    BackoffSpec,
    FleetSpec,
    HealthSpec,
    Profile,
    SupervisorSpec,
)
from console.profile.thresholds import parse_thresholds
from console.profile.toml import ProfileError, RawProfile, did_you_mean, not_a_table, read_profile
from console.ranges import out_of_range
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
                raise raw.error(table, key, not_a_table(f"{table}.{key}", value))
            kwargs[key] = _build(raw, f"{table}.{key}", nested[key], value)
            continue
        if key not in fields:
            raise raw.error(table, key, f"is not a [{table}] key{did_you_mean(key, [*fields, *extra])}")
        expected = {"float": float, "int": int, "str": str}.get(str(fields[key].type).split(" ")[0], None)
        if expected is None:
            expected = tuple if "tuple" in str(fields[key].type) else None
        kwargs[key] = _coerce(raw, table, key, value, expected) if expected else value
        if expected in (int, float) and (why := out_of_range(fields[key], kwargs[key])):
            raise raw.error(table, key, why)
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


def _not_a_table(key: str, value: Any) -> str:
    """What to write instead of a top-level key that is not a table (`[[server]]`, `server = ...`)."""
    servers = (
        "; a fleet's servers are [groups.NAME] tables, each with its `model` and `replicas`, sharing the keys "
        "of one [server] table (profiles/demo.toml)"
        if key in ("server", "groups")
        else ""
    )
    return not_a_table(key, value) + servers


def load_profile(path: str | Path) -> Profile:
    raw = read_profile(path)
    for key, value in raw.data.items():
        if key not in _TOP_LEVEL:
            raise raw.error("", key, f"is not a profile table{did_you_mean(key, [*_TOP_LEVEL, 'extends'])}")
        if not isinstance(value, dict):
            raise raw.error("", key, _not_a_table(key, value))
    fleet_table = raw.data.get("fleet", {})
    if "name" not in fleet_table:
        fleet_table = {**fleet_table, "name": Path(path).stem}
    nested = {"backoff": BackoffSpec, "health": HealthSpec}
    fleet = _build(raw, "fleet", FleetSpec, fleet_table, extra=_FLEET_EXTRA, nested=nested)
    _check_fleet(raw, fleet)
    supervisor = _build(raw, "supervisor", SupervisorSpec, raw.data.get("supervisor", {}))
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


def resolve_profile(profile: Profile, platform: Any = None) -> ResolvedFleet:
    """Every server of the fleet, each checked by resolving its ServerArgs like `tokenspeed serve` does."""
    raw = read_profile(profile.path)
    warn_readable_keys(raw)
    if raw.data.get("groups"):
        return resolve_groups(profile, raw, platform)
    return resolve_servers(profile, raw, profile.fleet, platform)


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
