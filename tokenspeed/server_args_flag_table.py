"""Rows of ``tokenspeed serve`` flags, declared as data and added to an argparse group in order.

Most flags differ only by their spelling, value type and help, so each argument group is a table of rows
rather than a run of ``add_argument`` calls; the row's position in its table is its place in ``--help``.
Defaults and choices still come from the ``ServerArgs`` field of the same name (``server_args_flags``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tokenspeed.server_args_flags import option, str_to_bool_flag, switch, toggle

# Marks "no default given": the row then takes the default of its ``ServerArgs`` field.
_FIELD_DEFAULT: Any = object()


class FlagRow(Protocol):
    """Anything that adds its flags to an argparse group (or mutually exclusive group)."""

    def add(self, group: Any) -> None: ...


@dataclasses.dataclass(frozen=True)
class Opt:
    """A valued flag (``--name VALUE``); ``type=None`` keeps the raw string (as ``action="append"`` wants)."""

    name: str
    type: Callable[[str], Any] | None
    help: str
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    nargs: str | None = None
    action: str | None = None
    default: Any = _FIELD_DEFAULT

    def add(self, group: Any) -> None:
        given = {"metavar": self.metavar, "nargs": self.nargs, "type": self.type, "action": self.action}
        kwargs = {key: value for key, value in given.items() if value is not None}
        if self.default is not _FIELD_DEFAULT:
            kwargs["default"] = self.default
        option(group, self.name, *self.aliases, help=self.help, **kwargs)


@dataclasses.dataclass(frozen=True)
class Switch:
    """A presence flag (``--name`` sets the field true)."""

    name: str
    help: str
    aliases: tuple[str, ...] = ()
    dest: str | None = None

    def add(self, group: Any) -> None:
        kwargs = {} if self.dest is None else {"dest": self.dest}
        switch(group, self.name, *self.aliases, help=self.help, **kwargs)


@dataclasses.dataclass(frozen=True)
class Toggle:
    """A ``--name`` / ``--no-name`` pair."""

    name: str
    help: str

    def add(self, group: Any) -> None:
        toggle(group, self.name, help=self.help)


@dataclasses.dataclass(frozen=True)
class OptionalBool:
    """A boolean taking an optional value: bare ``--name`` is true, ``--name false`` false."""

    names: tuple[str, ...]
    help: str
    dest: str | None = None

    def add(self, group: Any) -> None:
        kwargs = {} if self.dest is None else {"dest": self.dest}
        str_to_bool_flag(group, *self.names, help=self.help, **kwargs)


def add_flags(group: Any, rows: Iterable[FlagRow]) -> None:
    """Add ``rows`` to ``group`` in table order, which is the order ``--help`` lists them."""
    for row in rows:
        row.add(group)


def add_groups(parser: argparse.ArgumentParser, groups: Iterable[tuple[str, Iterable[FlagRow]]]) -> None:
    """Add one argument group per ``(title, rows)``, in order."""
    for title, rows in groups:
        add_flags(parser.add_argument_group(title), rows)
