"""A one-line key legend built once per screen.

Textual's Footer rebuilds a widget per key on every screen switch (tens of widgets, each styled);
with a screen switch on every number key that was most of the switch's CPU. A legend of plain text
costs one render.
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Static

_NAMES = {"question_mark": "?", "slash": "/", "escape": "esc", "space": "space", "enter": "enter"}


def key_label(key: str) -> str:
    first = key.split(",")[0]
    if first.startswith("ctrl+"):
        return "^" + first[5:]
    return _NAMES.get(first, first)


class KeyHints(Static):
    DEFAULT_CSS = """
    KeyHints { dock: bottom; height: 1; background: $panel; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.call_after_refresh(self.draw)

    def draw(self) -> None:
        screen, app = self.screen, self.app
        bindings = [*getattr(screen, "BINDINGS", []), *getattr(app, "BINDINGS", [])]
        text, seen = Text(), set()
        for binding in bindings:
            if not isinstance(binding, Binding) or not binding.show or binding.description in seen:
                continue
            action = binding.action.split("(")[0].removeprefix("app.")
            offers = getattr(app, "offers", None)
            if (offers(action) if offers is not None else app.check_action(action, ())) is False:
                continue  # read-only consoles do not advertise actions they will not run
            seen.add(binding.description)
            text.append(f" {key_label(binding.key)} ", style="bold reverse")
            text.append(f" {binding.description}  ")
        text.append(" ^p ", style="bold reverse")
        text.append(" palette")
        self.update(text)
