"""Numeric profile keys declared with the values they may take, and the one check of them.

A field written `rate_per_s: float = bounded(0.5, 0.001, 1000.0)` states its default and its range in one
place. `read_numbers` turns a TOML table of such fields ([load], [console.thresholds]) into the dataclass;
`out_of_range` checks one value (the [fleet] tables' numbers, read by `console.profile.fleet`). Errors name
the table and key through `RawProfile.error`, so they carry the profile's file and line.

No import of `console.profile` at module level: `console.supervisor.load` declares its fields with
`bounded`, and `console.profile` (its package init) imports that module back.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

_RANGE = "range"
_WHY = "why"


def bounded(default: float, low: float, high: float = math.inf, why: str = "") -> Any:
    """A dataclass field defaulting to `default` whose profile value must lie in [low, high]; `why`, what an
    edge value means, joins the error."""
    return dataclasses.field(default=default, metadata={_RANGE: (low, high), _WHY: why})


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def out_of_range(field: dataclasses.Field, value: float) -> str | None:
    """Why `value` does not fit `field`'s declared range; None when it fits or no range is declared."""
    if _RANGE not in field.metadata:
        return None
    low, high = field.metadata[_RANGE]
    if low <= value <= high:
        return None
    bounds = f">= {_number(low)}" if high == math.inf else f"between {_number(low)} and {_number(high)}"
    why = field.metadata.get(_WHY)
    return f"must be {bounds}{f' ({why})' if why else ''}, got {value!r}"


def read_numbers(raw, table: str, cls: type, values: dict) -> Any:
    """`cls` from a TOML table whose keys are all numeric fields of it (`raw` is a `RawProfile`)."""
    from console.profile.toml import did_you_mean

    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise raw.error(table, key, f"is not a [{table}] key{did_you_mean(key, fields)}")
        wants_int = fields[key].type == "int"
        ok_type = isinstance(value, int) if wants_int else isinstance(value, int | float)
        if isinstance(value, bool) or not ok_type:
            raise raw.error(table, key, f"expects {'an integer' if wants_int else 'a number'}, got {value!r}")
        if why := out_of_range(fields[key], value):
            raise raw.error(table, key, why)
        kwargs[key] = value if wants_int else float(value)
    return cls(**kwargs)
