"""The serve flag table states each fact once, and what the parser reads the table spells back.

A row names a value type, default or metavar only where its ``ServerArgs`` field (or argparse) would not
give the same one; ``to_argv`` of any field value parses back into that value.
"""

from __future__ import annotations

import pytest

from tokenspeed.config.cli import CLI_ALIAS_DESTS, build_parser, field_argv, rows_by_field
from tokenspeed.config.flag_rows import _FIELD_DEFAULT, _FIELD_TYPE, Opt, field_defaults, field_type
from tokenspeed.config.flag_table import flag_rows
from tokenspeed.config.flags import FIELD_CHOICES

OPTS = [row for row in flag_rows() if isinstance(row, Opt)]


def _derived_type(dest: str):
    try:
        return field_type(dest)
    except (AssertionError, KeyError):  # a field of several types, or a flag without a field
        return None


@pytest.mark.parametrize("row", OPTS, ids=lambda row: row.name)
def test_no_row_restates_what_its_field_gives(row):
    if row.type is not _FIELD_TYPE:
        assert row.type is not _derived_type(row.dest), f"{row.name}: type= repeats the field's annotation"
    if row.default is not _FIELD_DEFAULT:
        assert row.default != field_defaults().get(row.dest), f"{row.name}: default= repeats the field's"
    if row.metavar is not None and row.dest not in FIELD_CHOICES:
        assert row.metavar != row.dest.upper(), f"{row.name}: metavar= repeats argparse's own"


def _sample(field: str, row) -> object:
    if not isinstance(row, Opt):
        return not field_defaults().get(field)  # a boolean: the value that is not the default
    if field in FIELD_CHOICES:
        value = FIELD_CHOICES[field][-1]
    else:
        kind = row.type if row.type is not _FIELD_TYPE else field_type(row.dest)
        value = {int: 3, float: 0.25}.get(kind, "text")
    return [value] if row.nargs == "+" or row.action == "append" else value


@pytest.mark.parametrize("field", sorted(rows_by_field()))
def test_every_field_value_spelled_by_the_table_parses_back(field):
    row = rows_by_field()[field]
    value = _sample(field, row)
    namespace = build_parser().parse_args(["MODEL", *field_argv(field, value)])
    assert CLI_ALIAS_DESTS.get(row.dest, row.dest) == field
    assert getattr(namespace, row.dest) == value
