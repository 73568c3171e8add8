"""No import cycles among TokenSpeed's modules, imports inside functions included.

An import moved into a function to dodge a cycle still couples the two modules both ways; it only hides
the cycle from Python's loader. The graph (`tests/import_graph.py`) reads every `import` in `tokenspeed/`
and `console/` (at any depth, TYPE_CHECKING blocks too); this fails on a strongly connected group of
modules, naming it, so a shared part is moved down into a module both can import instead.
"""

from __future__ import annotations

from tests.import_graph import cycles, import_graph


def test_cycle_finder_sees_a_cycle_through_a_function_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (move the shared part into a module both can import):\n" + "\n".join(
        " <-> ".join(group) for group in found
    )
