"""Runs a kernel-checks module (`python -m tests.engine.<name>`) under Triton's interpreter on the CPU and
returns the JSON object it prints last.

A process of its own: TRITON_INTERPRET is read when a kernel is defined, at import, so the kernels must be
imported fresh with it set, whatever the pytest process has imported already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(module: str, timeout: float = 300.0) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
