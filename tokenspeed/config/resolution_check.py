"""A server checks that it resolved its arguments as the supervisor that started it did.

The console resolves a profile once (`ServerArgs.from_dict`), plans the fleet from that resolution and
starts each server with a command line spelled from its fields; `tokenspeed serve` resolves that command
line again. The supervisor puts its resolution in the server's environment (`EXPECTED_ENV`) and the
server logs every field it resolved differently (another TokenSpeed on the node, an environment variable
the supervisor did not see) before it starts: the plan made from the supervisor's resolution may not
hold for it.
"""

from __future__ import annotations

import json
from typing import Any

EXPECTED_ENV = "TOKENSPEED_EXPECTED_RESOLUTION"
# Drawn at random when not given / passed through the environment rather than the command line.
_UNCOMPARED = frozenset({"seed", "api_key"})


def comparable(args: Any) -> dict[str, Any]:
    """The resolved fields as JSON values (tuples as lists, anything else as its text)."""
    fields = {k: v for k, v in args.to_dict().items() if k not in _UNCOMPARED}
    return json.loads(json.dumps(fields, default=str))


def expected_env(args: Any) -> dict[str, str]:
    """The environment entry a supervisor gives the server it starts with `args`."""
    return {EXPECTED_ENV: json.dumps(comparable(args), sort_keys=True)}


def differences(args: Any, expected: str | None) -> list[str]:
    """`field: supervisor A, serve B` for every field resolved differently (none without an expectation)."""
    if not expected:
        return []
    try:
        theirs = json.loads(expected)
    except ValueError:
        return [f"${EXPECTED_ENV} is not JSON; nothing compared"]
    mine = comparable(args)
    return [
        f"{name}: supervisor {theirs.get(name)!r}, serve {mine.get(name)!r}"
        for name in sorted(set(theirs) | set(mine))
        if theirs.get(name) != mine.get(name)
    ]
