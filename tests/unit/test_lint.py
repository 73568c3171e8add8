"""The repository stays lint-clean: `ruff check` and the vulture dead-code check pass on the whole tree.

Both tools ship in the `test` extra; the test skips only when one is not installed. Their settings live in
pyproject.toml ([tool.ruff], [tool.vulture]); names vulture cannot see used are in .ci/vulture_whitelist.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_check_passes():
    result = _run_tool("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"


def test_no_dead_code():
    result = _run_tool("vulture")  # paths and min_confidence from [tool.vulture]
    assert result.returncode == 0, (
        "vulture found unused code; remove it, or if a caller outside TokenSpeed needs it, add the name "
        f"with its reason to .ci/vulture_whitelist.py:\n{result.stdout}{result.stderr}"
    )
