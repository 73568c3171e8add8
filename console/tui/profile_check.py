"""Validate profile text being edited, through the pre-flight `tokenspeed up` runs (every problem at once).

The loader reads files (and `extends` resolves relative to the file), so the text is checked as a
temporary file (console/profile/preflight.py `preflight_text`; the plan: next to the profile it will
replace); problems are reported against the real path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    line: int | None  # in the file being edited; None when the problem is elsewhere (a base file)
    key: str
    message: str

    def describe(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.key + ': ' if self.key else ''}{self.message}"


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    servers: tuple[str, ...] = ()
    # Every problem, in line order: the loader's and the pre-flight's (models, ports, state directory).
    problems: tuple[Problem, ...] = ()

    @property
    def line(self) -> int | None:
        """The first problem's line (ctrl+g goes there)."""
        return next((p.line for p in self.problems if p.line), None)

    def describe(self, path: str) -> str:
        if self.ok:
            return f"{path}: valid, {len(self.servers)} server(s): {', '.join(self.servers)}"
        lines = [p.describe() for p in self.problems]
        return "\n".join(lines if len(lines) == 1 else [f"{len(lines)} problems:", *lines])


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


def check_profile_text(text: str, path: str | Path, state_dir: str | Path | None = None) -> CheckResult:
    """The text as `tokenspeed up` would take it: every loader error and the pre-flight's problems at once
    (`state_dir`: where the fleet is kept, when not its default)."""
    from console.profile.preflight import preflight_text

    target = Path(path).resolve()
    try:
        report = preflight_text(text, target, state_dir=state_dir)
    except (ValueError, TypeError, OSError) as exc:
        return CheckResult(ok=False, problems=(Problem(None, "", str(exc)),))
    if report.ok:
        return CheckResult(ok=True, servers=tuple(_server_names(report.resolved)))
    problems = []
    for p in report.problems:
        here = p.path is not None and Path(p.path).resolve() == target
        message = p.message if here or p.path is None else f"{p.path}:{p.line}: {p.message}"
        problems.append(Problem(p.line if here else None, p.key, message))
    return CheckResult(ok=False, problems=tuple(problems))


def _server_names(resolved) -> list[str]:
    specs = getattr(resolved, "specs", None) or getattr(resolved, "servers", None) or []
    return [str(getattr(spec, "name", spec)) for spec in specs]
