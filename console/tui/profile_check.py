"""Validate profile text being edited, through the same loader `tokenspeed up` uses.

The loader reads files (and `extends` resolves relative to the file), so the text is checked as a
temporary file next to the profile it will replace; the error is reported against the real path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    line: int | None = None
    key: str = ""
    message: str = ""
    servers: tuple[str, ...] = ()

    def describe(self, path: str) -> str:
        if self.ok:
            return f"{path}: valid, {len(self.servers)} server(s): {', '.join(self.servers)}"
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.key + ': ' if self.key else ''}{self.message}"


@contextmanager
def _as_file(text: str, target: Path) -> Iterator[str]:
    directory = target.parent if target.parent.is_dir() else Path(tempfile.gettempdir())
    fd, tmp = tempfile.mkstemp(prefix=".check-", suffix=".toml", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield tmp
    finally:
        os.unlink(tmp)


def plan_profile_text(text: str, path: str | Path) -> dict | str:
    """The probe's plan for the profile being edited (a dict as `tokenspeed profile plan --json`), or why not."""
    from console.probe import probe_gpus
    from console.profile.fleet import load_and_resolve
    from console.profile.plan import plan_here

    with _as_file(text, Path(path)) as tmp:
        try:
            return plan_here(load_and_resolve(tmp), probe_gpus()).to_dict()
        except (ValueError, OSError) as exc:
            return f"no plan: {str(exc).replace(tmp, str(path))}"


def check_profile_text(text: str, path: str | Path) -> CheckResult:
    from console.profile.fleet import ProfileError, load_and_resolve

    target = Path(path)
    with _as_file(text, target) as tmp:
        try:
            resolved = load_and_resolve(tmp)
        except ProfileError as exc:
            message = str(exc.message).replace(tmp, str(target))
            return CheckResult(ok=False, line=exc.line, key=exc.key, message=message)
        except (ValueError, TypeError, OSError) as exc:
            return CheckResult(ok=False, message=str(exc).replace(tmp, str(target)))
        # Without [fleet] name the fleet is named after the file: name it after the real one.
        names = (n.replace(Path(tmp).stem, target.stem) for n in _server_names(resolved))
        return CheckResult(ok=True, servers=tuple(names))


def _server_names(resolved) -> list[str]:
    specs = getattr(resolved, "specs", None) or getattr(resolved, "servers", None) or []
    return [str(getattr(spec, "name", spec)) for spec in specs]
