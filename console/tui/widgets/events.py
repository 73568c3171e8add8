"""The events pane (k9s events): what happened to which server and when, newest at the bottom.

Events come from the supervisor (its history database, so a replay shows them too): starts, exits with
their reason, restarts, health changes, stalls, drains, profile reloads, expert rebalances.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text

KIND_STYLE = {
    "exit": "red",
    "fatal": "bold red",
    "kill": "bold red",
    "stall": "bold red",
    "health": "yellow",
    "restart": "yellow",
    "drain": "yellow",
    "reload": "cyan",
    "rebalance": "cyan",
    "start": "green",
}


def events_text(events: list[dict[str, Any]], rows: int, selected: str | None) -> Text:
    """The last `rows` events, one a line; the selected server's in bold."""
    if not events:
        return Text("events: none in the last 10 minutes", style="dim")
    text = Text()
    shown = events[-rows:]
    width = max(len(str(e.get("server", ""))) for e in shown)
    for i, event in enumerate(shown):
        when = time.strftime("%H:%M:%S", time.localtime(float(event.get("t") or 0)))
        kind = str(event.get("kind") or "note")
        server = str(event.get("server") or "")
        text.append(f"{when} ", style="dim")
        text.append(server.ljust(width) + " ", style="bold" if server == selected else "")
        text.append(f"{kind:<9} ", style=KIND_STYLE.get(kind, ""))
        text.append(str(event.get("text") or ""))
        if i < len(shown) - 1:
            text.append("\n")
    return text
