"""Rows of ``tokenspeed serve`` flags, declared as data and added to an argparse group in order.

Most flags differ only by their spelling, value type and help, so each argument group is a table of rows
rather than a run of ``add_argument`` calls; the row's position in its table is its place in ``--help``.
Defaults and choices still come from the ``ServerArgs`` field of the same name (``config.flags``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tokenspeed.config.flags import FIELD_CHOICES, str_to_bool
from tokenspeed.config.server_args import ServerArgs

# Marks "no default given": the row then takes the default of its ``ServerArgs`` field.
_FIELD_DEFAULT: Any = object()



@functools.cache
def field_defaults() -> dict[str, Any]:
    """Default of every ``ServerArgs`` field that has a plain default."""
    return {f.name: f.default for f in dataclasses.fields(ServerArgs) if f.default is not dataclasses.MISSING}


def _dest(flags: tuple[str, ...], kwargs: dict[str, Any]) -> str:
    if "dest" in kwargs:
        return kwargs["dest"]
    long_flags = [f for f in flags if f.startswith("--")]
    return (long_flags[0] if long_flags else flags[0]).lstrip("-").replace("-", "_")


def option(group: Any, *flags: str, **kwargs: Any) -> argparse.Action:
    """A valued flag whose default and choices come from the ``ServerArgs`` field of the same name."""
    dest = _dest(flags, kwargs)
    if "default" not in kwargs:
        kwargs["default"] = field_defaults().get(dest)
    if "choices" not in kwargs and dest in FIELD_CHOICES:
        kwargs["choices"] = list(FIELD_CHOICES[dest])
    return group.add_argument(*flags, **kwargs)


def switch(group: Any, *flags: str, help: str, **kwargs: Any) -> argparse.Action:  # noqa: A002
    """A presence flag (``store_true``) for a boolean field."""
    dest = _dest(flags, kwargs)
    default = field_defaults().get(dest, False)
    # A field whose default is None is decided at resolution unless the flag is given.
    kwargs.setdefault("default", None if default is None else bool(default))
    return group.add_argument(*flags, action="store_true", help=help, **kwargs)


def toggle(group: Any, *flags: str, help: str, **kwargs: Any) -> argparse.Action:  # noqa: A002
    """A ``--x`` / ``--no-x`` pair for a boolean field."""
    dest = _dest(flags, kwargs)
    kwargs.setdefault("default", bool(field_defaults().get(dest, False)))
    return group.add_argument(*flags, action=argparse.BooleanOptionalAction, help=help, **kwargs)


def str_to_bool_flag(group: Any, *flags: str, help: str, **kwargs: Any) -> argparse.Action:  # noqa: A002
    """An optional boolean: bare ``--x`` means true, ``--x false`` false, absent keeps the default."""
    kwargs.setdefault("default", field_defaults().get(_dest(flags, kwargs)))
    return group.add_argument(*flags, type=str_to_bool, nargs="?", const=True, help=help, **kwargs)

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
class SwitchPair:
    """An on flag and an off flag of one boolean field, which exclude each other (the seed's
    ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``); the field's default stays in force
    when neither is given."""

    name: str
    off: str
    help: str
    off_help: str

    @property
    def dest(self) -> str:
        return _dest((self.name,), {})

    def add(self, group: Any) -> None:
        pair = group.add_mutually_exclusive_group()
        switch(pair, self.name, help=self.help)
        pair.add_argument(self.off, dest=self.dest, action="store_false", help=self.off_help)


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
