"""`[server]` table -> the command line of `tokenspeed serve`, flag by flag, through ServerArgs' own parser.

Going through the argparse parser that `tokenspeed serve` uses (rather than building ServerArgs
directly) means a profile and a hand-typed command resolve through exactly the same code: aliases,
`str_to_bool` flags, `--no-...` negations and every resolution rule.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import re
from dataclasses import dataclass

from console.profile.toml import RawProfile, did_you_mean

# Keys the fleet sets for each server process; a profile sets them through [fleet] instead.
FLEET_OWNED = {
    "host": "[fleet] host",
    "port": "[fleet] base_port (replica i listens on base_port + port_stride * i)",
    "node_rank": "[fleet] nodes (each node of a replica gets its rank)",
    "dist_init_addr": "[fleet] nodes and dist_init_port",
    "base_gpu_id": "[fleet] gpus",
    "gpu_id_step": "[fleet] gpus",
}


@functools.lru_cache(maxsize=1)
def serve_parser() -> argparse.ArgumentParser:
    from tokenspeed.config.cli import add_cli_args

    parser = argparse.ArgumentParser(prog="tokenspeed serve", allow_abbrev=False)
    add_cli_args(parser)
    return parser


@functools.lru_cache(maxsize=1)
def server_field_names() -> frozenset[str]:
    import dataclasses

    from tokenspeed.config.server_args import ServerArgs

    return frozenset(f.name for f in dataclasses.fields(ServerArgs))


@dataclass(frozen=True)
class _Option:
    flag: str
    action: argparse.Action


def _options_for(key: str) -> list[argparse.Action]:
    """Every optional action that writes `key`, or whose flag is spelled from `key` (`ep_size` -> --ep-size)."""
    spellings = {"--" + key, "--" + key.replace("_", "-")}
    found = []
    for action in serve_parser()._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        if action.dest == key or spellings & set(action.option_strings):
            found.append(action)
    return found


def known_keys() -> list[str]:
    dests = {a.dest for a in serve_parser()._actions if a.option_strings}
    return sorted((server_field_names() | dests) - {"help"})


def _long_flag(action: argparse.Action, key: str = "") -> str:
    """The flag a reader recognises: the one spelled from the key, else the longest."""
    for spelled in ("--" + key.replace("_", "-"), "--" + key):
        if spelled in action.option_strings:
            return spelled
    longs = [s for s in action.option_strings if s.startswith("--")]
    return max(longs, key=len) if longs else action.option_strings[0]


def _scalar(raw: RawProfile, key: str, action: argparse.Action, value) -> str:
    if isinstance(value, dict | list):
        text = json.dumps(value)
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value)
    if action.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise raw.error("server", key, f"expects an integer, got {value!r}")
    if action.type is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise raw.error("server", key, f"expects a number, got {value!r}")
    if callable(action.type) and action.type not in (int, float, str):
        try:
            action.type(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise raw.error("server", key, f"invalid value {value!r}: {exc}") from None
    if action.choices is not None:
        converted = action.type(text) if callable(action.type) else text
        if converted not in action.choices:
            choices = ", ".join(map(str, action.choices))
            hint = did_you_mean(text, [str(c) for c in action.choices])
            raise raw.error("server", key, f"{value!r} is not one of: {choices}{hint}")
    return text


def _flag_args(raw: RawProfile, key: str, value) -> list[str]:
    actions = _options_for(key)
    if not actions:
        raise raw.error("server", key, "is a ServerArgs field but has no command-line flag; it cannot be set")
    switches = [a for a in actions if a.nargs == 0]
    if switches:
        if not isinstance(value, bool):
            raise raw.error("server", key, f"expects true or false, got {value!r}")
        for action in switches:
            if getattr(action, "const", None) is value:
                return [_long_flag(action, key)]
        if all(a.default == value for a in switches):
            return []  # asking for the default of a one-way switch
        raise raw.error("server", key, f"has no flag that sets it to {str(value).lower()}")
    action = actions[0]
    flag = _long_flag(action, key)
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        values = value if isinstance(value, list) else [value]
        return [flag, *(_scalar(raw, key, action, v) for v in values)]
    return [flag, _scalar(raw, key, action, value)]


def server_argv(raw: RawProfile) -> list[str]:
    """The `tokenspeed serve` arguments that `[server]` stands for (fleet-owned keys excluded)."""
    server = raw.data.get("server", {})
    if not isinstance(server, dict):
        raise raw.error("", "server", "must be a table: [server]")
    if "model" not in server:
        raise raw.error("server", "model", "is required: the model path or name of every server")
    keys = set(known_keys())
    argv: list[str] = []
    for key, value in server.items():
        if key in FLEET_OWNED:
            raise raw.error("server", key, f"is set per server by the fleet; use {FLEET_OWNED[key]}")
        if key not in keys:
            raise raw.error("server", key, f"is not a ServerArgs field{did_you_mean(key, keys)}")
        argv += _flag_args(raw, key, value)
    return argv


def parse_server_args(raw: RawProfile, argv: list[str], platform=None):
    """ServerArgs from `argv` exactly as `tokenspeed serve` builds it; errors point into the profile."""
    from tokenspeed.config.cli import prepare_server_args

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return prepare_server_args(argv, platform=platform)
    except SystemExit:
        message = captured.getvalue().strip().splitlines()
        raise _blame(raw, message[-1] if message else "invalid arguments") from None
    except (ValueError, TypeError) as exc:
        raise _blame(raw, str(exc)) from None


def _blame(raw: RawProfile, message: str):
    """Attach a resolution error to the [server] key whose flag or name the message mentions."""
    server = raw.data.get("server", {})
    for key in server:
        names = {key, *(s for a in _options_for(key) for s in a.option_strings)}
        if any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", message) for n in names):
            return raw.error("server", key, message)
    return raw.error("server", next(iter(server), ""), message)
