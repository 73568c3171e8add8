"""Fleet screen: one row per server, sortable, filterable, coloured by health, marks for bulk actions."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.events import Click
from textual.widgets import Input, Static

from console.profile.thresholds import Thresholds, thresholds_of
from console.supervisor.load_report import LoadReport
from console.tui import fmt
from console.tui.fleet_columns import SHOWN_WHEN_SET, Column, columns, row_cells, stale_age
from console.tui.model import Fleet, Server, Snapshot
from console.tui.screens.base import ConsoleScreen
from console.tui.widgets.events import events_text
from console.tui.widgets.server_table import Row, ServerTable


def compile_filter(text: str) -> Callable[[Server], bool]:
    """k9s-style filter: a regex (or plain text if it is not one) over name, node and state; `!` inverts."""
    text = text.strip()
    invert = text.startswith("!")
    text = text[1:] if invert else text
    if not text:
        return lambda server: True
    try:
        pattern = re.compile(text, re.IGNORECASE)
    except re.error:
        pattern = re.compile(re.escape(text), re.IGNORECASE)

    def match(server: Server) -> bool:
        hit = any(pattern.search(field) for field in (server.name, server.node, server.state))
        return hit != invert

    return match


class FleetScreen(ConsoleScreen):
    MODE = "fleet"
    BINDINGS = [
        *ConsoleScreen.BINDINGS,
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear", show=False),
        Binding("space", "mark", "Mark"),
        Binding("l", "open('logs')", "Logs", show=False),
        Binding("e", "open('experts')", "Experts", show=False),
        Binding("o", "sort_next", "Sort"),
        Binding("O", "sort_reverse", "Reverse", show=False),
        # k9s style: shift+letter sorts by a column, the same again reverses ("?" lists the letters).
        *[
            Binding(c.sort_letter, f"sort_by('{c.key}')", f"Sort by {c.label.split()[0]}", show=False)
            for c in columns("")
            if c.sort_letter
        ],
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sort_key = "state"  # problems first: broken states, then errors, KV pressure, slow TTFT
        self.sort_reverse = False
        self.filter_text = ""
        self.cells: dict[str, Row] = {}  # what each visible row shows, by server
        self.shown: tuple[Column, ...] = ()  # the columns that fit the terminal, in order
        self.widths: list[int] = []
        self._thresholds: tuple[str | None, Thresholds] = (None, Thresholds())
        self._shown_texts: dict[str, Text] = {}

    def compose(self):
        yield from self.compose_header()
        with Vertical(id="fleet-body"):
            load = Static("", id="fleet-load", classes="detail")
            # Hidden until a fleet with [load] is drawn; set here, not in on_mount, which may run after the
            # first draw and would hide a line already shown.
            load.display = False
            yield load
            yield Static("", id="fleet-header")
            yield ServerTable(id="fleet-table")
            yield Static("", id="fleet-detail", classes="detail")
            yield Static("", id="fleet-nodes", classes="detail")
            yield Static("", id="fleet-events", classes="detail")
            yield Input(placeholder="filter: regex over name, node, state; !x inverts", id="fleet-filter")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self.query_one("#fleet-filter", Input).display = False
        self.query_one(ServerTable).focus()
        # The header scrolls sideways with the rows.
        self.watch(self.table, "scroll_x", lambda _: self._draw_header(), init=False)

    def thresholds(self, fleet: Fleet) -> Thresholds:
        """The profile's [console.thresholds], read once per profile path."""
        if self._thresholds[0] != fleet.profile_path:
            self._thresholds = (fleet.profile_path, thresholds_of(fleet.profile_path))
        return self._thresholds[1]

    @property
    def table(self) -> ServerTable:
        return self.query_one(ServerTable)

    # ------------------------------------------------------------------ drawing

    def _update(self, widget_id: str, text: Text) -> None:
        """Update a line only when it changed: an update re-lays the screen out, which costs more than this
        (the one-line header never changes size, so it skips the layout)."""
        if self._shown_texts.get(widget_id) != text:
            self._shown_texts[widget_id] = text
            self.query_one(widget_id, Static).update(text, layout=widget_id != "#fleet-header")

    def show(self, snapshot: Snapshot) -> None:
        if snapshot.fleet is not None:
            # On a short terminal the table keeps the room: fewer event lines.
            rows = 6 if self.size.height >= 34 else 3
            self._update(
                "#fleet-events", events_text(list(snapshot.fleet.events), rows, self.console.selected)
            )
        if snapshot.fleet is None:
            self.query_one("#fleet-detail", Static).update(
                Text(f"no fleet data: {snapshot.error or 'waiting for the supervisor'}", style="bold red")
            )
            return
        self._draw(snapshot.fleet)
        self._draw_load(snapshot.fleet.load)

    def _draw_load(self, load: LoadReport | None) -> None:
        """The built-in load generator's counts above the table; the line is there only with [load]."""
        line = self.query_one("#fleet-load", Static)
        line.display = load is not None
        if load is None:
            return
        text = Text(load.describe().partition(" (last error: ")[0], style="bold")
        if load.sent_per_s:
            text.append(f"  ({fmt.rate(load.sent_per_s)} req/s sent over the last minute)", style="dim")
        if load.last_error:
            age = f" {fmt.duration(time.time() - load.last_error_at)} ago" if load.last_error_at else ""
            text.append(f"\n  last error{age}: {load.last_error}", style="bold red")
        line.update(text)

    def redraw(self) -> None:
        snapshot = self.console.snapshot
        if snapshot is not None and snapshot.fleet is not None:
            self._draw(snapshot.fleet)

    def _columns(self, fleet: Fleet) -> tuple[Column, ...]:
        return columns(fleet.window_label)

    def _visible(self, fleet: Fleet) -> list[Server]:
        keep = compile_filter(self.filter_text)
        column = next(c for c in self._columns(fleet) if c.key == self.sort_key)
        servers = [s for s in fleet.servers if keep(s)]
        return sorted(servers, key=column.sort, reverse=self.sort_reverse)

    def _labels(self, cols: tuple[Column, ...]) -> list[str]:
        arrow = " ▼" if self.sort_reverse else " ▲"
        return [c.label + (arrow if c.key == self.sort_key else "") for c in cols]

    def _fresh_s(self, fleet: Fleet) -> float:
        """Values older than two polls (the console's or the supervisor's, the slower) are stale."""
        return 2 * max(self.console.poller.state.interval, fleet.metrics_interval_s) + 0.5

    def _draw(self, fleet: Fleet) -> None:
        servers = self._visible(fleet)
        every = self._columns(fleet)
        now = self.console.source.now or time.time()  # a replay's own moment
        thresholds, fresh = self.thresholds(fleet), self._fresh_s(fleet)
        marked = self.console.marked
        cells = {
            s.name: row_cells(s, every, thresholds, stale_age(s, now, fresh), s.name in marked)
            for s in servers
        }
        labels = self._labels(every)
        widths = [len(label) for label in labels]
        for row in cells.values():
            widths = [max(w, c.cell_len) for w, c in zip(widths, row, strict=True)]
        # Leave out the lowest-priority columns until the rest fit the terminal (an empty AGE column too).
        keep = [
            i for i, c in enumerate(every)
            if c.key not in SHOWN_WHEN_SET or any(r[i].plain for r in cells.values())
        ]  # fmt: skip
        room = max(self.size.width, 40) - 2
        while sum(widths[i] + 2 for i in keep) > room:
            droppable = [i for i in keep if every[i].priority > 0]
            if not droppable:
                break
            keep.remove(max(droppable, key=lambda i: (every[i].priority, i)))
        self.shown = tuple(every[i] for i in keep)
        self.widths = [widths[i] for i in keep]
        self.cells = {name: tuple(row[i] for i in keep) for name, row in cells.items()}
        self._draw_header()
        table = self.table
        table.set_rows(list(self.cells.items()), self.widths, keep=self.console.selected)
        if table.current is not None and table.current != self.console.selected:
            self.console.selected = table.current
        self._draw_detail(fleet, len(servers))

    def _draw_header(self) -> None:
        header = Text(" ", style="bold")
        for column, label, width in zip(self.shown, self._labels(self.shown), self.widths, strict=True):
            header.append(
                label.ljust(width + 2), style="bold reverse" if column.key == self.sort_key else "bold"
            )
        scroll_x = int(self.table.scroll_x) if self.is_mounted else 0
        self._update("#fleet-header", header[scroll_x:] if scroll_x else header)

    def _draw_detail(self, fleet: Fleet, shown: int) -> None:
        server = fleet.server(self.console.selected)
        detail = Text()
        if server is not None:
            detail.append(f"{server.name}", style="bold")
            detail.append(f"  pid {server.pid or '-'}  {server.url or '-'}  last exit: ")
            detail.append(server.last_exit.describe() if server.last_exit else "-")
            if server.error:
                detail.append(f"  error: {server.error}", style="bold red")
        if shown != len(fleet.servers):
            detail.append(
                f"   [{shown} of {len(fleet.servers)} shown: filter '{self.filter_text}']", style="cyan"
            )
        self._update("#fleet-detail", detail)
        nodes: dict[str, list[Server]] = {}
        for s in fleet.servers:
            nodes.setdefault(s.node, []).append(s)
        summary = Text("nodes: ")
        for node, members in sorted(nodes.items()):
            ready = sum(1 for s in members if s.health == "ok")
            style = "green" if ready == len(members) else ("red" if ready == 0 else "yellow")
            summary.append(f"{node} {ready}/{len(members)}", style=style)
            summary.append("  ")
        self._update("#fleet-nodes", summary)

    # ------------------------------------------------------------------ events and actions

    def on_server_table_highlighted(self, event: ServerTable.Highlighted) -> None:
        self.console.selected = event.name
        snapshot = self.console.snapshot
        if snapshot is not None and snapshot.fleet is not None:
            self._draw_detail(snapshot.fleet, len(self.table.names))

    def on_server_table_selected(self, event: ServerTable.Selected) -> None:
        self.console.open_server(event.name)

    def on_click(self, event: Click) -> None:
        # A click on a column title sorts by it (again: reverses).
        if event.widget is not self.query_one("#fleet-header", Static):
            return
        x = event.x - 1 + int(self.table.scroll_x)
        for column, width in zip(self.shown, self.widths, strict=True):
            if x < width + 2:
                self.action_sort_by(column.key)
                return
            x -= width + 2

    def action_open(self, mode: str) -> None:
        if self.console.selected:
            self.console.open_server(self.console.selected, mode)

    def action_mark(self) -> None:
        name = self.console.selected
        if name is None:
            return
        self.console.marked.symmetric_difference_update({name})
        self.redraw()
        self.console.refresh_status()
        self.table.action_move(1)

    def action_sort_next(self) -> None:
        keys = [c.key for c in self.shown] or [c.key for c in columns("")]
        index = keys.index(self.sort_key) if self.sort_key in keys else -1
        self.sort_key, self.sort_reverse = keys[(index + 1) % len(keys)], False
        self.redraw()

    def action_sort_by(self, key: str) -> None:
        """Sort by `key`; the same column again reverses the order."""
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = key, False
        self.redraw()
        label = next(c.label for c in columns("") if c.key == key).split()[0]
        self.notify(f"sorted by {label}" + (" (reversed)" if self.sort_reverse else ""), timeout=2)

    def action_sort_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self.redraw()

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        if self.console.marked and not self.filter_text and not box.display:
            self.console.marked.clear()
        box.value = ""
        box.display = False
        self.filter_text = ""
        self.table.focus()
        self.redraw()
        self.console.refresh_status()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()
        if not self.filter_text:
            event.input.display = False
