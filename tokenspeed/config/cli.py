"""The ``tokenspeed serve`` command line both ways, from the flag table (``config.flag_table``): the parser
and the namespace -> ``ServerArgs`` mapping, and ``ServerArgs`` fields spelled back into flags.

    to_argv({"model": "m", "attn_tp_size": 2, "enable_prefix_caching": False})
        -> ["--model", "m", "--attn-tp-size", "2", "--no-enable-prefix-caching"]

The console resolves a profile with ``ServerArgs.from_dict`` and spells a server's command line only
when it starts the process; ``prepare_server_args(to_argv(fields))`` resolves to the same arguments
(tests/console/test_profile_server.py checks it for every shipped profile). Each row parses and spells
its own flags (``config.flag_rows``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import os
from collections.abc import Mapping
from typing import Any

from tokenspeed.config.api_key import resolve_api_key
from tokenspeed.config.flag_rows import FlagRow, NoFlag, add_groups
from tokenspeed.config.flag_table import GROUPS, flag_rows
from tokenspeed.config.flags import FIELD_ALIASES
from tokenspeed.config.server_args import ServerArgs

__all__ = ["CLI_ALIAS_DESTS", "NoFlag", "build_parser", "field_argv", "prepare_server_args", "to_argv"]

# Namespace attributes that are spellings of a field rather than fields themselves: the table's alias
# rows (the positional model, --tp, --expert-parallel-size) and --api-key-file, whose file gives api_key
# (read by namespace_to_fields, config/api_key.py).
CLI_ALIAS_DESTS = {
    **{row.dest: FIELD_ALIASES[row.dest] for row in flag_rows() if row.dest in FIELD_ALIASES},
    "api_key_file": "api_key",
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    # Prefix matching would make adding a flag a breaking change for scripts using an abbreviation.
    parser.allow_abbrev = False
    add_groups(parser, GROUPS)


def namespace_to_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Turn a parsed namespace into ``ServerArgs`` keyword arguments, folding flag aliases."""
    values = dict(vars(args))
    positional = values.pop("model_path", None)
    if positional is not None and values.get("model") is not None:
        raise ValueError("the model is given twice (positional and --model); keep one of them")
    if positional is not None:
        values["model"] = positional
    if values.get("model") is None:
        raise ValueError("a model is required: `tokenspeed serve MODEL` or --model MODEL")
    tp = values.pop("tensor_parallel_size", None)
    if tp is not None:
        if values.get("attn_tp_size") is not None:
            raise ValueError(
                "--tp/--tensor-parallel-size and --attn-tp-size set the same size; pass only one"
            )
        values["attn_tp_size"] = tp
    ep = values.pop("expert_parallel_size", None)
    values["ep_size"] = 1 if ep is None else ep
    if "api_key" in values:
        values["api_key"] = resolve_api_key(values["api_key"], values.pop("api_key_file", None), os.environ)
    if "metrics_reporters" in values:
        # Repeated flags can name a reporter twice; keep the first of each.
        values["metrics_reporters"] = list(dict.fromkeys(values["metrics_reporters"] or ["prometheus"]))
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    # Only pass what the parser produced, so fields without a flag keep their dataclass default.
    return {name: value for name, value in values.items() if name in names}


def from_namespace(args: argparse.Namespace, platform: Any = None) -> ServerArgs:
    """Build (and resolve) a ``ServerArgs`` from a namespace parsed by ``build_parser()``."""
    return ServerArgs(**namespace_to_fields(args), platform=platform)


class _ServeArgumentParser(argparse.ArgumentParser):
    """argparse, plus a "did you mean" for a mistyped flag (there are more than 150 of them)."""

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            known = [opt for action in self._actions for opt in action.option_strings]
            hints = []
            for word in message.split(":", 1)[1].split():
                if word.startswith("--"):
                    flag = word.split("=", 1)[0]
                    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
                    if close:
                        hints.append(f"{flag}: did you mean {close[0]}?")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """A parser with every ``tokenspeed serve`` flag."""
    parser = _ServeArgumentParser(prog=prog, allow_abbrev=False)
    add_cli_args(parser)
    return parser


def prepare_server_args(argv: list[str], platform: Any = None) -> ServerArgs:
    """Parse ``argv`` (typically ``sys.argv[2:]`` after ``serve``) into a resolved ``ServerArgs``."""
    return from_namespace(build_parser().parse_args(argv), platform=platform)


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
