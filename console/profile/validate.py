"""`tokenspeed profile validate`: every mistake of a profile, each as `file:line: [table] key: why`.

The loader (the one `tokenspeed up` runs) stops at its first error. To find the next ones the profile is
loaded again from a copy in which each reported line is blanked: the key's line, or the whole table for
a table error. Lines are blanked, not removed, so every later error keeps the line number of the real
file; the copy lives in a temporary directory with `extends` made absolute, and errors name the real
file. The loop ends when the copy loads, when an error has no line in this file (a base file's mistake,
a cross-field rule without a line) or repeats, or after MAX_ERRORS.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from console.profile.toml import ProfileError

if TYPE_CHECKING:
    from console.profile.fleet import ResolvedFleet

MAX_ERRORS = 20
_HEADER = re.compile(r"^\s*\[")
_EXTENDS = re.compile(r"""^(\s*extends\s*=\s*)(["'])(.*?)\2(.*)$""")


def _absolute_extends(lines: list[str], base: Path) -> list[str]:
    out = []
    for line in lines:
        match = _EXTENDS.match(line)
        if match and not Path(match.group(3)).is_absolute():
            target = (base / match.group(3)).resolve()
            line = f'{match.group(1)}"{target}"{match.group(4)}'
        out.append(line)
    return out


def _span(lines: list[str], index: int) -> range:
    """The lines to blank for an error at `index` (0-based): a table header takes its whole table, a key
    its line and the continuation lines of a multi-line array or table value."""
    if _HEADER.match(lines[index]):
        end = index + 1
        while end < len(lines) and not _HEADER.match(lines[end]):
            end += 1
        return range(index, end)
    depth, end = 0, index
    while True:
        text = lines[end].split("#", 1)[0]
        depth += text.count("[") + text.count("{") - text.count("]") - text.count("}")
        end += 1
        if depth <= 0 or end >= len(lines):
            return range(index, end)


def _relabel(exc: ProfileError, copy: Path, original: Path) -> ProfileError:
    path = original if exc.path is not None and Path(exc.path) == copy else exc.path
    message = exc.message.replace(str(copy), str(original))
    return ProfileError(message, path, exc.line, exc.key)


def load_all(path: str | Path) -> tuple[list[ProfileError], ResolvedFleet | None]:
    """Every error the loader finds, and the fleet the profile resolves to: the real one when there is no
    error, else the one of the copy with the wrong lines blanked, when that loads (so the pre-flight can
    still check its ports and state directory), else None."""
    from console.profile.fleet import load_and_resolve

    original = Path(path).resolve()
    try:
        lines = original.read_text().splitlines()
    except OSError:
        lines = None
    try:
        return [], load_and_resolve(original)
    except ProfileError as exc:
        first: ProfileError = exc
    except ValueError as exc:
        return [ProfileError(str(exc), original)], None
    if lines is None:
        return [first], None
    lines = _absolute_extends(lines, original.parent)
    errors: list[ProfileError] = []
    resolved: ResolvedFleet | None = None
    seen: set[tuple[int | None, str]] = set()
    with tempfile.TemporaryDirectory(prefix="tokenspeed-validate-") as tmp:
        copy = Path(tmp) / original.name  # the same name: a fleet's default name is the file's stem
        error: ProfileError | None = first
        while error is not None and len(errors) < MAX_ERRORS:
            here = error.path is not None and Path(error.path) in (copy, original)
            error = _relabel(error, copy, original) if here else error
            if (error.line, str(error)) in seen:
                break
            seen.add((error.line, str(error)))
            errors.append(error)
            if not here or error.line is None or not lines[error.line - 1].strip():
                break
            for i in _span(lines, error.line - 1):
                lines[i] = ""
            copy.write_text("\n".join(lines) + "\n")
            try:
                resolved = load_and_resolve(copy)
                error = None
            except ProfileError as exc:
                error = exc
            except ValueError as exc:
                errors.append(ProfileError(str(exc).replace(str(copy), str(original)), original))
                error = None
    # file order; an error with no line of its own (a rule across keys, or what a blanked table took away) last
    return sorted(errors, key=lambda e: (str(e.path), e.line is None, e.line or 0)), resolved
