"""``ServerArgs`` fields back into a ``tokenspeed serve`` command line, from the flag tables themselves.

    to_argv({"model": "m", "attn_tp_size": 2, "enable_prefix_caching": False})
        -> ["--model", "m", "--attn-tp-size", "2", "--no-enable-prefix-caching"]

The console resolves a profile with ``ServerArgs.from_dict`` and spells a server's command line only
when it starts the process; ``prepare_server_args(to_argv(fields))`` resolves to the same arguments
(tests/console/test_profile_server.py checks it for every shipped profile).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from tokenspeed.config.cli import CLI_ALIAS_DESTS, flag_rows
from tokenspeed.config.flag_table import (
    FlagRow,
    Opt,
    OptionalBool,
    Switch,
    SwitchPair,
    Toggle,
    field_defaults,
)


class NoFlag(ValueError):
    """A field value that no ``tokenspeed serve`` flag can express."""


def _long(flags: tuple[str, ...], name: str = "") -> str:
    """The flag a reader recognises: the one spelled from the field's name, else the first long one."""
    spelled = "--" + name.replace("_", "-")
    if spelled in flags:
        return spelled
    longs = [f for f in flags if f.startswith("--")]
    return longs[0] if longs else flags[0]


def _dest(flags: tuple[str, ...]) -> str:
    return _long(flags).lstrip("-").replace("-", "_")


@functools.cache
def rows_by_field() -> dict[str, FlagRow]:
    """The flag row that writes each field (aliases such as ``--tp`` folded into their field)."""
    rows: dict[str, FlagRow] = {}
    for row in flag_rows():
        if isinstance(row, Opt):
            dest = _dest((row.name, *row.aliases))
        elif isinstance(row, Switch):
            dest = row.dest or _dest((row.name, *row.aliases))
        elif isinstance(row, Toggle):
            dest = _dest((row.name,))
        elif isinstance(row, OptionalBool):
            dest = row.dest or _dest(row.names)
        elif isinstance(row, SwitchPair):
            dest = row.dest
        else:
            continue  # the positional model (``--model`` spells it)
        field = CLI_ALIAS_DESTS.get(dest, dest)
        if field not in rows or dest == field:  # the field's own flag over an alias of it
            rows[field] = row
    return rows


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def field_argv(name: str, value: Any) -> list[str]:
    """The flags that set field ``name`` to ``value``; NoFlag when none can."""
    row = rows_by_field().get(name)
    if row is None:
        raise NoFlag("is a ServerArgs field without a command-line flag; it cannot be set")
    if isinstance(row, SwitchPair):  # a mutually exclusive on / off pair
        return [row.name if value else row.off]
    if isinstance(row, Toggle):
        return [row.name if value else "--no-" + row.name.removeprefix("--")]
    if isinstance(row, OptionalBool):
        return [_long(row.names, name), _text(bool(value))]
    if isinstance(row, Switch):
        if value:
            return [_long((row.name, *row.aliases), name)]
        if not field_defaults().get(name):
            return []  # off is its default
        raise NoFlag("can only be switched on from the command line; leave it out for its default")
    flag = _long((row.name, *row.aliases), name)
    if row.action == "append":
        return [
            part for item in (value if isinstance(value, list) else [value]) for part in (flag, _text(item))
        ]
    if row.nargs in ("+", "*"):
        return [flag, *map(_text, value if isinstance(value, list) else [value])]
    return [flag, _text(value)]


def to_argv(fields: Mapping[str, Any]) -> list[str]:
    """The command line of ``fields`` (ServerArgs field names; None values are left to their defaults)."""
    argv: list[str] = []
    for name, value in fields.items():
        if value is not None:
            argv += field_argv(name, value)
    return argv
