"""The `[server]` table -> ServerArgs fields -> a resolved `ServerArgs`, with errors on the profile's key.

    fields = server_fields(raw)                          # names, types and choices checked, per key
    args = resolve_server(raw, fields, owned, platform)  # ServerArgs.from_dict: `tokenspeed serve`'s rules

No command line is involved: the fields are checked against `ServerArgs`' own field types and choices,
and resolved by `ServerArgs.from_dict`, the code `tokenspeed serve` runs after parsing its flags. The
command line (`tokenspeed.config.cli.to_argv`) is spelled only when a process is started.

A rule of resolution that fails (a value out of range, two fields that contradict each other) is put on
the profile key it comes from by resolving again without each key in turn: the keys whose absence lets
the profile resolve are the ones to change. The message is never parsed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any

from console.profile.toml import ProfileError, RawProfile, did_you_mean, not_a_table

# Keys the fleet sets for each server process; a profile sets them through [fleet] instead.
FLEET_OWNED = {
    "host": "[fleet] host",
    "port": "[fleet] base_port (replica i listens on base_port + port_stride * i)",
    "node_rank": "[fleet] nodes (each node of a replica gets its rank)",
    "dist_init_addr": "[fleet] nodes and dist_init_port",
    "base_gpu_id": "[fleet] gpus",
    "gpu_id_step": "[fleet] gpus",
}
# Derived when the arguments resolve; never written.
_DERIVED = {"mapping"}


@functools.cache
def _field_types() -> dict[str, Any]:
    from tokenspeed.config.server_args import ServerArgs

    hints = typing.get_type_hints(ServerArgs)
    return {f.name: hints[f.name] for f in dataclasses.fields(ServerArgs) if f.name not in _DERIVED}


@functools.cache
def _aliases() -> dict[str, str]:
    """Other names a profile may use for a field: the flags' own spellings (`tensor_parallel_size`)."""
    from tokenspeed.config.cli import CLI_ALIAS_DESTS

    return {alias: field for alias, field in CLI_ALIAS_DESTS.items() if field in _field_types()}


def known_keys() -> list[str]:
    return sorted({*_field_types(), *_aliases()})


def _choices(name: str) -> tuple[Any, ...] | None:
    from tokenspeed.config.flags import FIELD_CHOICES

    return FIELD_CHOICES.get(name)


def _kinds(annotation: Any) -> list[Any]:
    """The alternatives of a field's type, None left out (TOML has no null)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _matches(kind: Any, value: Any) -> bool:
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return value in typing.get_args(kind)
    if origin is list:
        (item,) = typing.get_args(kind) or (Any,)
        return isinstance(value, list) and all(item is Any or _matches(item, v) for v in value)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return isinstance(kind, type) and isinstance(value, kind)


def _describe(kinds: list[Any]) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    out = []
    for kind in kinds:
        if typing.get_origin(kind) is typing.Literal:
            out.append("one of " + ", ".join(map(repr, typing.get_args(kind))))
        elif typing.get_origin(kind) is list:
            out.append("a list")
        else:
            out.append(names.get(kind, getattr(kind, "__name__", str(kind))))
    return " or ".join(out)


def check_value(raw: RawProfile, key: str, value: Any, table: str = "server") -> Any:
    """`value` as field `key` takes it (a TOML table for a JSON-text field becomes its JSON), or a
    ProfileError naming the key, the type it expects and, for a choice, the closest one."""
    field = _aliases().get(key, key)
    kinds = _kinds(_field_types()[field])
    if isinstance(value, dict) and str in kinds:
        value = json.dumps(value)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not any(_matches(kind, value) for kind in kinds):
        raise raw.error(table, key, f"expects {_describe(kinds)}, got {value!r}")
    choices = _choices(field)
    if choices is not None and value not in choices:
        hint = did_you_mean(str(value), [str(c) for c in choices])
        raise raw.error(table, key, f"{value!r} is not one of: {', '.join(map(str, choices))}{hint}")
    return value


def check_key(raw: RawProfile, table: str, key: str, extra: tuple[str, ...] = ()) -> None:
    if key in FLEET_OWNED:
        raise raw.error(table, key, f"is set per server by the fleet; use {FLEET_OWNED[key]}")
    if key not in _field_types() and key not in _aliases():
        raise raw.error(table, key, f"is not a ServerArgs field{did_you_mean(key, [*known_keys(), *extra])}")


def server_fields(raw: RawProfile) -> dict[str, Any]:
    """The ServerArgs fields `[server]` sets, checked one key at a time (fleet-owned keys refused)."""
    server = raw.data.get("server", {})
    if not isinstance(server, dict):
        raise raw.error("", "server", not_a_table("server", server))
    if "model" not in server:
        raise raw.error("server", "model", "is required: the model path or name of every server")
    from tokenspeed.config.cli import NoFlag, field_argv

    fields: dict[str, Any] = {}
    for key, value in server.items():
        check_key(raw, "server", key)
        field = _aliases().get(key, key)
        fields[field] = check_value(raw, key, value)
        try:
            field_argv(field, fields[field])  # its server is started with a command line: it must have one
        except NoFlag as exc:
            raise raw.error("server", key, str(exc)) from None
    return fields


def _resolve(fields: dict[str, Any], platform: Any):
    from tokenspeed.config.server_args import ServerArgs
    from tokenspeed.config.support_check import refuse_unsupported

    args = ServerArgs.from_dict(fields, platform=platform)
    refuse_unsupported(args)  # what `tokenspeed serve` would refuse is refused at the profile check
    return args


def resolve_server(raw: RawProfile, fields: dict[str, Any], owned: dict[str, Any], platform: Any = None):
    """ServerArgs of `fields` plus the fleet's own (`owned`: host, port, ...), as `tokenspeed serve` would
    resolve them; a resolution error becomes a ProfileError on the profile key it comes from."""
    try:
        return _resolve({**fields, **owned}, platform)
    except (ValueError, TypeError) as exc:
        raise blame(raw, fields, owned, platform, exc) from None


def blame(raw: RawProfile, fields: dict[str, Any], owned: dict[str, Any], platform: Any, exc: Exception):
    """The error on the key(s) whose absence lets the arguments resolve; else on [server] itself."""
    culprits = []
    for key in fields:
        if key == "model":
            continue  # without it nothing resolves: it tells nothing
        rest = {k: v for k, v in fields.items() if k != key}
        try:
            _resolve({**rest, **owned}, platform)
        except (ValueError, TypeError):
            continue
        culprits.append(key)
    written = {_aliases().get(k, k): k for k in raw.data.get("server", {})}
    if not culprits:
        return raw.error("server", "", str(exc))
    also = [written.get(k, k) for k in culprits[1:]]
    suffix = f" (together with {', '.join(f'[server] {k}' for k in also)})" if also else ""
    return raw.error("server", written.get(culprits[0], culprits[0]), f"{exc}{suffix}")


__all__ = ["FLEET_OWNED", "ProfileError", "blame", "known_keys", "resolve_server", "server_fields"]
