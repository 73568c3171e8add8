"""The console's screens and widgets sit below the app: the app lists them as its modes, so none of them
imports `console.tui.app` back, not even inside a function or for type checking (that hides a cycle)."""

from __future__ import annotations

import pytest

from tests.import_graph import import_graph

GRAPH = import_graph()
BELOW_THE_APP = sorted(m for m in GRAPH if m.startswith(("console.tui.screens.", "console.tui.widgets.")))


@pytest.mark.parametrize("module", BELOW_THE_APP)
def test_no_screen_or_widget_imports_the_app(module: str):
    assert "console.tui.app" not in GRAPH[module], f"{module} imports console.tui.app"


def test_the_screens_are_found():
    names = {m.rpartition(".")[2] for m in BELOW_THE_APP}
    assert names >= {"base", "fleet", "server", "server_table"}
