"""Validate profile text being edited, through the same loader `tokenspeed up` uses.

The loader reads files (and `extends` resolves relative to the file), so the text is checked as a
temporary file next to the profile it will replace; the error is reported against the real path.
"""

from __future__ import annotations

import os
import tempfile
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


def check_profile_text(text: str, path: str | Path) -> CheckResult:
    from console.profiles import ProfileError, load_and_resolve

    target = Path(path)
    directory = target.parent if target.parent.is_dir() else Path(tempfile.gettempdir())
    fd, tmp = tempfile.mkstemp(prefix=".check-", suffix=".toml", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
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
    finally:
        os.unlink(tmp)


def _server_names(resolved) -> list[str]:
    specs = getattr(resolved, "specs", None) or getattr(resolved, "servers", None) or []
    return [str(getattr(spec, "name", spec)) for spec in specs]
