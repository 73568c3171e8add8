"""The kinds of row in the ``tokenspeed serve`` flag table (``config.flag_table``).

A row states a flag's facts once: its spellings and help and, where they are not the ``ServerArgs``
field's own, a value type, default or metavar (the type otherwise comes from the field's annotation, the
default from the field, the choices from ``config.flags``).
Each kind both adds itself to an argparse group (``config.cli``) and spells a field value back into
flags (``config.cli.to_argv``), so parsing and spelling cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import typing
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tokenspeed.config.flags import FIELD_ALIASES, FIELD_CHOICES, str_to_bool
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.server_fields import type_alternatives

# Mark "not given": the row then takes the default, or the value type, of its ``ServerArgs`` field.
_FIELD_DEFAULT: Any = object()
_FIELD_TYPE: Any = object()


class NoFlag(ValueError):
    """A field value that no ``tokenspeed serve`` flag can express."""


@functools.cache
def field_defaults() -> dict[str, Any]:
    """Default of every ``ServerArgs`` field that has a plain default."""
    return {f.name: f.default for f in dataclasses.fields(ServerArgs) if f.default is not dataclasses.MISSING}


@functools.cache
def field_type(name: str) -> Callable[[str], Any]:
    """The type a flag parses a value of field ``name`` (or a flag alias of it) into, read from the field's
    annotation: ``int | None`` gives int, ``list[int]`` int (one per value), a Literal its values' type."""
    kinds = type_alternatives(typing.get_type_hints(ServerArgs)[FIELD_ALIASES.get(name, name)])
    assert len(kinds) == 1, f"{name}: a field of several types needs its flag row to name one"
    kind = kinds[0]
    if typing.get_origin(kind) is typing.Literal:
        return type(typing.get_args(kind)[0])
    if typing.get_origin(kind) is list:
        return typing.get_args(kind)[0]
    return kind


def dest_of(flags: tuple[str, ...]) -> str:
    """The namespace attribute argparse gives ``flags``: the first long spelling, in snake case."""
    long_flags = [f for f in flags if f.startswith("--")]
    return (long_flags[0] if long_flags else flags[0]).lstrip("-").replace("-", "_")


def spelling(flags: tuple[str, ...], field: str) -> str:
    """The flag a reader recognises: the one spelled from the field's name, else the first long one."""
    spelled = "--" + field.replace("_", "-")
    if spelled in flags:
        return spelled
    return next((f for f in flags if f.startswith("--")), flags[0])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class FlagRow(Protocol):
    """One row of the flag table: its spellings, the namespace attribute it writes, how it is parsed
    and how a value of its field is spelled."""

    @property
    def flags(self) -> tuple[str, ...]: ...

    @property
    def dest(self) -> str: ...

    def add(self, group: Any) -> None: ...

    def argv(self, field: str, value: Any) -> list[str]: ...


def _fill_dest(row: Any) -> None:
    if not row.dest:  # frozen dataclass: the derived dest is set once, at construction
        object.__setattr__(row, "dest", dest_of(row.flags))


@dataclasses.dataclass(frozen=True)
class _Named:
    """A row spelled ``--name`` (plus any aliases) that writes the attribute they spell unless ``dest``
    names another."""

    name: str
    help: str
    aliases: tuple[str, ...] = ()
    dest: str = ""

    def __post_init__(self) -> None:
        _fill_dest(self)

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclasses.dataclass(frozen=True)
class Opt(_Named):
    """A valued flag (``--name VALUE``) parsed as its field's type unless ``type`` names another;
    ``type=None`` keeps the raw string (as ``action="append"`` wants)."""

    type: Callable[[str], Any] | None = _FIELD_TYPE
    metavar: str | None = None
    nargs: str | None = None
    action: str | None = None
    default: Any = _FIELD_DEFAULT

    def add(self, group: Any) -> None:
        value_type = field_type(self.dest) if self.type is _FIELD_TYPE else self.type
        given = {"metavar": self.metavar, "nargs": self.nargs, "type": value_type, "action": self.action}
        kwargs = {key: value for key, value in given.items() if value is not None}
        default = self.default
        kwargs["default"] = field_defaults().get(self.dest) if default is _FIELD_DEFAULT else default
        if self.dest in FIELD_CHOICES:
            kwargs["choices"] = list(FIELD_CHOICES[self.dest])
        group.add_argument(*self.flags, help=self.help, **kwargs)

    def argv(self, field: str, value: Any) -> list[str]:
        flag = spelling(self.flags, field)
        if self.action == "append":
            return [part for item in _items(value) for part in (flag, _text(item))]
        if self.nargs in ("+", "*"):
            return [flag, *map(_text, _items(value))]
        return [flag, _text(value)]


@dataclasses.dataclass(frozen=True)
class Switch(_Named):
    """A presence flag (``store_true``): ``--name`` sets the field true."""

    def add(self, group: Any) -> None:
        default = field_defaults().get(self.dest, False)
        # A field whose default is None is decided at resolution unless the flag is given.
        default = None if default is None else bool(default)
        group.add_argument(*self.flags, action="store_true", help=self.help, default=default)

    def argv(self, field: str, value: Any) -> list[str]:
        if value:
            return [spelling(self.flags, field)]
        if not field_defaults().get(field):
            return []  # off is its default
        raise NoFlag("can only be switched on from the command line; leave it out for its default")


@dataclasses.dataclass(frozen=True)
class Toggle(_Named):
    """A ``--name`` / ``--no-name`` pair."""

    def add(self, group: Any) -> None:
        default = bool(field_defaults().get(self.dest, False))
        group.add_argument(
            *self.flags, action=argparse.BooleanOptionalAction, help=self.help, default=default
        )

    def argv(self, field: str, value: Any) -> list[str]:
        return [self.name if value else "--no-" + self.name.removeprefix("--")]


@dataclasses.dataclass(frozen=True)
class SwitchPair(_Named):
    """An on flag (``name``) and an off flag (``off``) of one boolean field, which exclude each other (the
    seed's ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``); the field's default stays in
    force when neither is given."""

    off: str = ""
    off_help: str = ""

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.name, self.off)

    def add(self, group: Any) -> None:
        pair = group.add_mutually_exclusive_group()
        Switch(self.name, self.help).add(pair)
        pair.add_argument(self.off, dest=self.dest, action="store_false", help=self.off_help)

    def argv(self, field: str, value: Any) -> list[str]:
        return [self.name if value else self.off]


@dataclasses.dataclass(frozen=True)
class OptionalBool(_Named):
    """A boolean taking an optional value: bare ``--name`` is true, ``--name false`` false, absent keeps
    the default."""

    def add(self, group: Any) -> None:
        default = field_defaults().get(self.dest)
        kwargs = {"type": str_to_bool, "nargs": "?", "const": True, "default": default}
        group.add_argument(*self.flags, dest=self.dest, help=self.help, **kwargs)

    def argv(self, field: str, value: Any) -> list[str]:
        return [spelling(self.flags, field), _text(bool(value))]


@dataclasses.dataclass(frozen=True)
class Positional:
    """An optional positional argument standing for a flag (``tokenspeed serve MODEL`` for ``--model``):
    parsed into ``dest``, never spelled back, since the flag spells its field."""

    dest: str
    metavar: str
    help: str
    flags: tuple[str, ...] = ()

    def add(self, group: Any) -> None:
        group.add_argument(self.dest, nargs="?", metavar=self.metavar, default=None, help=self.help)

    def argv(self, field: str, value: Any) -> list[str]:
        raise AssertionError(f"the positional {self.metavar} is spelled by its flag")


def add_groups(parser: argparse.ArgumentParser, groups: Iterable[tuple[str, Iterable[FlagRow]]]) -> None:
    """Add one argument group per ``(title, rows)``, rows in table order (the order ``--help`` lists)."""
    for title, rows in groups:
        group = parser.add_argument_group(title)
        for row in rows:
            row.add(group)
