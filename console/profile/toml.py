"""Reading profile TOML: `extends` chains, and errors that name the file, the line and the key.

`tomllib` gives values but not positions, so `locate()` finds a key's line by scanning the text of the
file that supplied it (after `extends`, each key remembers its source file).
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TABLE = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")  # [table] or [[array of tables]]
_TOML_POS = re.compile(r"\(at line (\d+), column \d+\)")


class ProfileError(ValueError):
    """A profile mistake: `path:line: [table] key: what is wrong (did you mean ...?)`."""

    def __init__(self, message: str, path: Path | None = None, line: int | None = None, key: str = ""):
        self.message = message
        self.path = path
        self.line = line
        self.key = key
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        super().__init__(f"{where}{key + ': ' if key else ''}{message}")


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


@dataclass
class RawProfile:
    """Merged tables of a profile and, for each `(table, key)`, the file that set it."""

    data: dict
    origin: dict[tuple[str, str], Path]
    sources: list[Path]

    def error(self, table: str, key: str, message: str) -> ProfileError:
        path = self.origin.get((table, key), self.sources[0])
        label = f"[{table}] {key}" if table else key
        return ProfileError(message, path, locate(path, table, key), label)


def not_a_table(header: str, value: Any) -> str:
    """Why `[header]` holds no table: what was found there (`[[header]]` is a list of tables)."""
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        got = f"[[{header}]] (a list of {len(value)} table{'s' if len(value) != 1 else ''})"
    else:
        got = repr(value)
    return f"must be a table: [{header}], written once; got {got}"


def locate(path: Path, table: str, key: str) -> int | None:
    """Line number (1-based) of `key` inside `[table]` of the file, or of the table header."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    current = ""
    header_line = None
    own_header = f"{table}.{key}" if table else key  # the key may itself be a table: [fleet.health]
    own_line = None
    leaf = key.split(".")[-1]
    key_re = re.compile(rf"^\s*(?:[\w\-]+\.)*[\"']?{re.escape(leaf)}[\"']?\s*=")
    for number, text in enumerate(lines, 1):
        match = _TABLE.match(text)
        if match:
            current = match.group(1).replace('"', "").replace(" ", "")
            if current == table and header_line is None:
                header_line = number
            # A table named only through its sub-tables ([group.dense] for a misspelled [groups]) is
            # still found, at its first sub-table's header.
            if own_line is None and (current == own_header or current.startswith(own_header + ".")):
                own_line = number
            continue
        if current == table and key_re.match(text):
            return number
    return own_line or header_line


def _parse(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ProfileError("file not found", path) from None
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror}", path) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POS.search(str(exc))
        line = int(match.group(1)) if match else None
        raise ProfileError(f"not valid TOML: {_TOML_POS.sub('', str(exc)).strip()}", path, line) from None


def _merge(base: dict, top: dict, origin: dict, path: Path, table: str = "") -> dict:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value, origin, path, f"{table}.{key}" if table else key)
        else:
            merged[key] = value
            _record(origin, path, table, key, value)
    return merged


def _record(origin: dict, path: Path, table: str, key: str, value) -> None:
    origin[(table, key)] = path
    if isinstance(value, dict):
        sub = f"{table}.{key}" if table else key
        for inner_key, inner in value.items():
            _record(origin, path, sub, inner_key, inner)


def read_profile(path: str | Path) -> RawProfile:
    """Parse a profile and every file it `extends` (relative to the extending file), base first."""
    chain: list[Path] = []
    current = Path(path).resolve()
    while True:
        if current in chain:
            cycle = " -> ".join(str(p) for p in [*chain, current])
            raise ProfileError(
                f"`extends` forms a cycle: {cycle}", chain[-1], locate(chain[-1], "", "extends")
            )
        chain.append(current)
        data = _parse(current)
        parent = data.get("extends")
        if parent is None:
            break
        if not isinstance(parent, str):
            raise ProfileError("`extends` must be a path string", current, locate(current, "", "extends"))
        parent_path = (current.parent / parent).resolve()
        if not parent_path.exists():
            raise ProfileError(
                f"extends a file that does not exist: {parent_path}",
                current,
                locate(current, "", "extends"),
                "extends",
            )
        current = parent_path
    merged: dict = {}
    origin: dict[tuple[str, str], Path] = {}
    for source in reversed(chain):
        data = dict(_parse(source))
        data.pop("extends", None)
        merged = _merge(merged, data, origin, source)
    return RawProfile(merged, origin, chain)
