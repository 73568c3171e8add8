"""The rows of the `?` help: every key that applies here and now, by a name a person reads.

Only keys that do something on the current screen in the current mode are listed: replay keys only in a
replay, actions not in a read-only console, the focused widget's navigation keys (arrows, page keys,
Home/End, Enter) with the screen's own. Sort letters are folded into one row.
"""

from __future__ import annotations

from textual.binding import Binding

_NAMES = {
    "question_mark": "?",
    "slash": "/",
    "escape": "esc",
    "space": "space",
    "enter": "enter",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
    "left_curly_bracket": "{",
    "right_curly_bracket": "}",
    "exclamation_mark": "!",
    "up": "↑",
    "down": "↓",
    "left": "←",
    "right": "→",
    "pageup": "PgUp",
    "pagedown": "PgDn",
    "home": "Home",
    "end": "End",
    "tab": "Tab",
    "shift+tab": "Shift+Tab",
}


def key_name(key: str) -> str:
    """`left_square_bracket` -> `[`, `ctrl+r` -> `ctrl+r`, `e,enter` -> `e / enter`."""
    return " / ".join(_NAMES.get(k.strip(), k.strip()) for k in key.split(","))


def help_rows(app, screen, focused) -> list[tuple[str, str]]:
    """(key, what it does) for the app's, the screen's and the focused widget's bindings that apply."""
    rows: list[tuple[str, str]] = []
    sorts: list[str] = []
    sources = [getattr(focused, "BINDINGS", []), getattr(screen, "BINDINGS", []), app.BINDINGS]
    for bindings in sources:
        for binding in bindings:
            if not isinstance(binding, Binding) or not binding.description:
                continue
            action = binding.action.split("(")[0].removeprefix("app.")
            if not app.offers(action):
                continue
            if action == "sort_by":
                sorts.append(f"{binding.key} {binding.description.removeprefix('Sort by ').lower()}")
                continue
            if action == "switch_screen_to":
                continue  # one row for the number keys, below
            rows.append((key_name(binding.key), binding.description))
    if sorts:
        rows.append(("shift+letter", "sort by a column, again reverses: " + ", ".join(sorts)))
    rows.append(("1-6", "screens: fleet, server, experts, logs, profile, GPUs"))
    rows.append(("ctrl+p", "command palette"))
    seen: set[tuple[str, str]] = set()
    return [r for r in rows if not (r in seen or seen.add(r))]
