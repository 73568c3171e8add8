"""`--json` commands answer in JSON also when they fail: `{"error": "..."}` on stdout, same exit code.

The commands' implementations report errors as `error: ...` lines on stderr (what a person reads); a
script that asked for `--json` should not have to parse those. `run_json` runs an implementation with
both streams captured: its stdout goes out as it was when it printed JSON, and an error without JSON
output becomes one JSON object (the stderr text still goes to stderr for the person watching).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable

import click


def _error_text(stderr: str) -> str:
    lines = [line.removeprefix("error: ") for line in stderr.strip().splitlines()]
    return "\n".join(lines) or "failed without a message"


def run_json(impl: Callable[..., int], *args, **kwargs) -> int:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = impl(*args, **kwargs) or 0
    except Exception as exc:  # an unexpected failure is still an answer a script can read
        code = 1
        err.write(f"error: {type(exc).__name__}: {exc}\n")
    if err.getvalue():
        sys.stderr.write(err.getvalue())
    printed = out.getvalue()
    if code != 0 and not _is_json(printed):
        printed = json.dumps({"error": _error_text(err.getvalue()), "exit_code": code}) + "\n"
    sys.stdout.write(printed)
    return code


def _is_json(text: str) -> bool:
    if not text.strip():
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class JsonCommand(click.Command):
    """A click command whose usage errors (an unknown option, a missing argument) are JSON too when
    `--json` is among its arguments; without it they stay click's usual message."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if not wants_json:
                raise
            sys.stdout.write(json.dumps({"error": exc.format_message(), "exit_code": exc.exit_code}) + "\n")
            exc.show()
            ctx.exit(exc.exit_code)
