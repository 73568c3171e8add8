"""The console's screens and widgets sit below the app: the app lists them as its modes, so none of them
imports `console.tui.app` back, not even inside a function or for type checking (that hides a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TUI = Path(__file__).resolve().parents[2] / "console" / "tui"
BELOW_THE_APP = sorted([*TUI.glob("screens/*.py"), *TUI.glob("widgets/*.py")])


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", BELOW_THE_APP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_screen_or_widget_imports_the_app(path: Path):
    assert "console.tui.app" not in imported_modules(path), f"{path} imports console.tui.app"


def test_the_screens_are_found():
    assert {p.name for p in BELOW_THE_APP} >= {"base.py", "fleet.py", "server.py", "server_table.py"}
