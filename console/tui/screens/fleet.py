"""Fleet screen: one row per server, sortable, filterable, coloured by health, marks for bulk actions."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.events import Click
from textual.widgets import Input, Static

from console.supervisor.load_report import LoadReport
from console.tui import fmt
from console.tui.model import Fleet, Server, Snapshot
from console.tui.screens.base import ConsoleScreen
from console.tui.widgets.server_table import ServerTable

HEALTH_STYLE = {"ok": "green", "warn": "yellow", "bad": "bold red", "off": "dim"}


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    cell: Callable[[Server], str]
    sort: Callable[[Server], object]


def _m(server: Server, key: str) -> float | None:
    return getattr(server.metrics, key) if server.metrics is not None else None


def _sortable(value: float | None) -> float:
    return float("-inf") if value is None else value


COLUMNS = (
    Column("name", "NAME", lambda s: s.name, lambda s: s.name),
    Column("node", "NODE", lambda s: s.node, lambda s: (s.node, s.name)),
    Column("gpus", "GPUS", lambda s: ",".join(map(str, s.gpus)) or "cpu", lambda s: s.gpus),
    Column("state", "STATE", lambda s: s.state + ("!" if s.error else ""), lambda s: s.state),
    Column("uptime", "UPTIME", lambda s: fmt.duration(s.uptime_s), lambda s: _sortable(s.uptime_s)),
    Column("restarts", "RESTARTS", lambda s: str(s.restarts), lambda s: s.restarts),
    Column(
        "queue",
        "RUN/WAIT",
        lambda s: fmt.pair(fmt.count(_m(s, "running")), fmt.count(_m(s, "waiting"))),
        lambda s: (_sortable(_m(s, "running")), _sortable(_m(s, "waiting"))),
    ),
    Column("kv", "KV", lambda s: fmt.percent(_m(s, "kv_usage")), lambda s: _sortable(_m(s, "kv_usage"))),
    Column(
        "hit",
        "PREFIX HIT",
        lambda s: fmt.percent(_m(s, "prefix_hit_rate")),
        lambda s: _sortable(_m(s, "prefix_hit_rate")),
    ),
    Column(
        "tps",
        "TOK/S",
        lambda s: fmt.rate(_m(s, "gen_throughput")),
        lambda s: _sortable(_m(s, "gen_throughput")),
    ),
    Column(
        "ttft",
        "TTFT p50/p99",
        lambda s: fmt.pair(fmt.latency(_m(s, "ttft_p50")), fmt.latency(_m(s, "ttft_p99"))),
        lambda s: _sortable(_m(s, "ttft_p99")),
    ),
    Column(
        "errors",
        "ERRORS",
        lambda s: fmt.count(_m(s, "errors_total")),
        lambda s: _sortable(_m(s, "errors_total")),
    ),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)


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
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sort_key = "node"
        self.sort_reverse = False
        self.filter_text = ""
        self.cells: dict[str, tuple[Text, ...]] = {}  # what each visible row shows, by server

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
            yield Input(placeholder="filter: regex over name, node, state; !x inverts", id="fleet-filter")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self.query_one("#fleet-filter", Input).display = False
        self.query_one(ServerTable).focus()

    @property
    def table(self) -> ServerTable:
        return self.query_one(ServerTable)

    # ------------------------------------------------------------------ drawing

    def show(self, snapshot: Snapshot) -> None:
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

    def _visible(self, fleet: Fleet) -> list[Server]:
        keep = compile_filter(self.filter_text)
        column = next(c for c in COLUMNS if c.key == self.sort_key)
        servers = [s for s in fleet.servers if keep(s)]
        return sorted(servers, key=column.sort, reverse=self.sort_reverse)

    def _cells(self, server: Server) -> tuple[Text, ...]:
        style = HEALTH_STYLE.get(server.health, "")
        marked = server.name in self.console.marked
        cells = []
        for column in COLUMNS:
            text = column.cell(server)
            cell_style = ""
            if column.key in ("name", "state"):
                cell_style = style
            elif column.key == "errors" and text not in (fmt.DASH, "0"):
                cell_style = "red"
            elif column.key == "restarts" and server.restarts:
                cell_style = "yellow"
            if column.key == "name" and marked:
                text, cell_style = "● " + text, cell_style + " reverse"
            cells.append(Text(text, style=cell_style))
        return tuple(cells)

    def _labels(self) -> list[str]:
        arrow = " ▼" if self.sort_reverse else " ▲"
        return [c.label + (arrow if c.key == self.sort_key else "") for c in COLUMNS]

    def _draw(self, fleet: Fleet) -> None:
        servers = self._visible(fleet)
        self.cells = {s.name: self._cells(s) for s in servers}
        labels = self._labels()
        # Column widths from the texts themselves: len() is all it costs, nothing is measured twice.
        widths = [len(label) for label in labels]
        for cells in self.cells.values():
            widths = [max(w, c.cell_len) for w, c in zip(widths, cells, strict=True)]
        header = Text(" ", style="bold")
        for column, label, width in zip(COLUMNS, labels, widths, strict=True):
            header.append(
                label.ljust(width + 2), style="bold reverse" if column.key == self.sort_key else "bold"
            )
        self.query_one("#fleet-header", Static).update(header)
        rows = []
        for name, cells in self.cells.items():
            line = Text(" ")
            for cell, width in zip(cells, widths, strict=True):
                line.append_text(cell)
                line.append(" " * (width - cell.cell_len + 2))
            rows.append((name, line))
        table = self.table
        table.set_rows(rows, width=sum(widths) + 2 * len(widths) + 1, keep=self.console.selected)
        if table.current is not None and table.current != self.console.selected:
            self.console.selected = table.current
        self._draw_detail(fleet, len(servers))

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
        self.query_one("#fleet-detail", Static).update(detail)
        nodes: dict[str, list[Server]] = {}
        for s in fleet.servers:
            nodes.setdefault(s.node, []).append(s)
        summary = Text("nodes: ")
        for node, members in sorted(nodes.items()):
            ready = sum(1 for s in members if s.health == "ok")
            style = "green" if ready == len(members) else ("red" if ready == 0 else "yellow")
            summary.append(f"{node} {ready}/{len(members)}", style=style)
            summary.append("  ")
        self.query_one("#fleet-nodes", Static).update(summary)

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
        x = event.x - 1
        for column, label in zip(COLUMNS, self._labels(), strict=True):
            width = max(
                [len(label)]
                + [cells[COLUMN_KEYS.index(column.key)].cell_len for cells in self.cells.values()]
            )
            if x < width + 2:
                if column.key == self.sort_key:
                    self.sort_reverse = not self.sort_reverse
                else:
                    self.sort_key, self.sort_reverse = column.key, False
                self.redraw()
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
        index = COLUMN_KEYS.index(self.sort_key)
        self.sort_key = COLUMN_KEYS[(index + 1) % len(COLUMN_KEYS)]
        self.redraw()

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
