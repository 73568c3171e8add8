"""Results files of the benchmarks: every one is written here, with where its figures come from.

A figure in the docs is only as good as the run behind it. Each results file therefore carries a
`provenance` block that the writing script fills in, never a person: the script and its arguments, the
git commit of the tree it ran on (and whether that tree had uncommitted changes), the device it measured
(the GPU's name, or the CPU's), the time, and the environment switches that chose its kernels. `tests/unit/test_results_provenance.py` fails on a file
under `benchmarks/results/` without it, so a hand-made or renamed file cannot pass for a measurement.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

PROVENANCE_KEYS = ("script", "argv", "commit", "dirty", "device", "time")
# The environment switches that change which kernels a run measures, recorded in `switches` when set (a
# figure of a step with `TOKENSPEED_DECODE_ONE_LAUNCH=1` is not the default's). Named here rather than read
# by prefix, so no other variable, a secret such as TOKENSPEED_API_KEY least of all, reaches a results
# file; `tests/unit/test_bench_results_switches.py` checks each is the constant its module reads.
SWITCHES = (
    "TOKENSPEED_PDL",  # kernels/pdl.py
    "TOKENSPEED_DECODE_ONE_LAUNCH",  # kernels/decode_attention.py
    "TOKENSPEED_MOE_FUSED_ROUTE",  # moe/backend.py
    "TOKENSPEED_MOE_GEMV",  # moe/kernels/gemv_table.py
)


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


REPO = Path(__file__).resolve().parents[1]
# A benchmark that measures through another process (console_drills.py runs pytest) names itself here,
# as a JSON list [script, *arguments], so the file records what a person ran.
COMMAND_ENV = "TOKENSPEED_BENCH_COMMAND"


def _command() -> tuple[str, list[str]]:
    """The running script, relative to this checkout when it lies in it (`benchmarks/decode.py`), and its
    arguments."""
    if os.environ.get(COMMAND_ENV):
        script, *args = json.loads(os.environ[COMMAND_ENV])
        return script, args
    path = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else Path("python")
    args = list(sys.argv[1:])
    if path.name == "__main__.py":  # `python -m tokenspeed bench serving`, `python -m pytest`
        return path.parent.name, args
    try:
        return str(path.relative_to(REPO)), args
    except ValueError:
        return path.name, args


def _device() -> str:
    """What the figures were measured on: the GPU when the process used one, else the CPU."""
    torch = sys.modules.get("torch")  # only asked when the benchmark imported it: no CUDA start-up here
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_device_name(0)
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {os.cpu_count()} cores"


COMMIT_ENV = "TOKENSPEED_COMMIT"
# Results files written by earlier runs do not make the code under test differ from the commit.
_CODE = ("--", ".", ":!benchmarks/results")


def _differs_from(repo: Path, commit: str) -> bool | None:
    """Whether the tree differs from `commit` (None: no git, or a commit this .git does not hold)."""
    try:
        out = subprocess.run(["git", "diff", "--quiet", commit, *_CODE], cwd=repo, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: False, 1: True}.get(out.returncode)


def provenance() -> dict[str, Any]:
    repo = REPO
    script, args = _command()
    # The device machine gets a copy of the working tree whose .git, when there is one, is the checkout's
    # at the session's start, older than the tree sent: `TOKENSPEED_COMMIT=$(git rev-parse HEAD)` in the
    # device command names the commit that ran, and wins over what that .git says.
    named = os.environ.get(COMMIT_ENV)
    if named:
        commit, dirty = named, _differs_from(repo, named)
    else:
        commit = _git(repo, "rev-parse", "HEAD")
        status = _git(repo, "status", "--porcelain", "--untracked-files=no", *_CODE)
        dirty = bool(status) if status is not None else None  # None: no git to ask
    return {
        "script": script,
        "argv": args,
        "commit": commit,
        "dirty": dirty,
        "device": _device(),
        "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "switches": {name: os.environ[name] for name in SWITCHES if name in os.environ},
    }


def write_results(path: str | Path, data: dict[str, Any]) -> Path:
    """Write `data` to `path` as JSON with its provenance; returns the path written."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**data, "provenance": provenance()}, indent=2) + "\n")
    print(f"wrote {out}")
    return out
