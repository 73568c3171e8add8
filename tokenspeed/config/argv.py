"""``ServerArgs`` fields back into a ``tokenspeed serve`` command line, from the flag table itself.

    to_argv({"model": "m", "attn_tp_size": 2, "enable_prefix_caching": False})
        -> ["--model", "m", "--attn-tp-size", "2", "--no-enable-prefix-caching"]

The console resolves a profile with ``ServerArgs.from_dict`` and spells a server's command line only
when it starts the process; ``prepare_server_args(to_argv(fields))`` resolves to the same arguments
(tests/console/test_profile_server.py checks it for every shipped profile). Each row spells its own
flags (``config.flag_rows``); this module only finds the row of a field.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from tokenspeed.config.cli import CLI_ALIAS_DESTS
from tokenspeed.config.flag_rows import FlagRow, NoFlag
from tokenspeed.config.flag_table import flag_rows

__all__ = ["NoFlag", "field_argv", "rows_by_field", "to_argv"]


@functools.cache
def rows_by_field() -> dict[str, FlagRow]:
    """The flag row that writes each field (aliases such as ``--tp`` folded into their field)."""
    rows: dict[str, FlagRow] = {}
    for row in flag_rows():
        if not row.flags:
            continue  # the positional model (``--model`` spells it)
        field = CLI_ALIAS_DESTS.get(row.dest, row.dest)
        if field not in rows or row.dest == field:  # the field's own flag over an alias of it
            rows[field] = row
    return rows


def field_argv(name: str, value: Any) -> list[str]:
    """The flags that set field ``name`` to ``value``; NoFlag when none can."""
    row = rows_by_field().get(name)
    if row is None:
        raise NoFlag("is a ServerArgs field without a command-line flag; it cannot be set")
    return row.argv(name, value)


def to_argv(fields: Mapping[str, Any]) -> list[str]:
    """The command line of ``fields`` (ServerArgs field names; None values are left to their defaults)."""
    argv: list[str] = []
    for name, value in fields.items():
        if value is not None:
            argv += field_argv(name, value)
    return argv
