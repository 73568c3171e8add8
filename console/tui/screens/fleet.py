"""Fleet screen: one row per server, sortable, filterable, coloured by health, marks for bulk actions."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from console.tui import fmt
from console.tui.model import Fleet, Server, Snapshot
from console.tui.screens.base import ConsoleScreen

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
        Binding("enter", "open('server')", "Detail"),
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
        self._rows: tuple[str, ...] = ()
        self._cells: dict[str, tuple] = {}

    def compose(self):
        yield from self.compose_header()
        with Vertical(id="fleet-body"):
            table = DataTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
            yield table
            yield Static("", id="fleet-detail", classes="detail")
            yield Static("", id="fleet-nodes", classes="detail")
            yield Input(placeholder="filter: regex over name, node, state; !x inverts", id="fleet-filter")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self._label_sort_column(table)
        self.query_one("#fleet-filter", Input).display = False
        table.focus()

    # ------------------------------------------------------------------ drawing

    def show(self, snapshot: Snapshot) -> None:
        if snapshot.fleet is None:
            self.query_one("#fleet-detail", Static).update(
                Text(f"no fleet data: {snapshot.error or 'waiting for the supervisor'}", style="bold red")
            )
            return
        self._draw(snapshot.fleet)

    def redraw(self) -> None:
        snapshot = self.console.snapshot
        if snapshot is not None and snapshot.fleet is not None:
            self._draw(snapshot.fleet)

    def _visible(self, fleet: Fleet) -> list[Server]:
        keep = compile_filter(self.filter_text)
        column = next(c for c in COLUMNS if c.key == self.sort_key)
        servers = [s for s in fleet.servers if keep(s)]
        return sorted(servers, key=column.sort, reverse=self.sort_reverse)

    def _row(self, server: Server) -> tuple:
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

    def _label_sort_column(self, table: DataTable) -> None:
        """Mark the sort column in the header (DataTable has no relabelling, so the columns are re-added)."""
        arrow = " ▼" if self.sort_reverse else " ▲"
        labels = [c.label + (arrow if c.key == self.sort_key else "") for c in COLUMNS]
        if [c.label.plain for c in table.columns.values()] == labels:
            return
        table.clear(columns=True)
        for column, label in zip(COLUMNS, labels, strict=True):
            table.add_column(label, key=column.key)
        self._rows = ()

    def _draw(self, fleet: Fleet) -> None:
        table = self.query_one(DataTable)
        self._label_sort_column(table)
        servers = self._visible(fleet)
        names = tuple(s.name for s in servers)
        rows = {s.name: self._row(s) for s in servers}
        if names != self._rows:
            # Membership or order changed: rebuild, keeping the cursor on the same server.
            keep = self.console.selected
            table.clear()
            for name in names:
                table.add_row(*rows[name], key=name)
            self._rows = names
            if keep in names:
                table.move_cursor(row=names.index(keep), animate=False)
            # DataTable measures new rows on idle but keeps lines it drew before that cached with the
            # old column widths; touching one cell afterwards invalidates them (static data: replay).
            self.set_timer(0.05, self._touch_table)
        else:
            # Same rows: touch only the cells whose text changed (cheap with 64 servers at 1 Hz).
            for name in names:
                old = self._cells.get(name)
                for i, cell in enumerate(rows[name]):
                    if old is None or old[i] != cell:
                        table.update_cell(name, COLUMN_KEYS[i], cell, update_width=True)
        self._cells = rows
        if names and (self.console.selected not in names):
            self.console.selected = names[table.cursor_row if 0 <= table.cursor_row < len(names) else 0]
        self._draw_detail(fleet, len(servers))

    def _touch_table(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.update_cell_at((0, 0), table.get_cell_at((0, 0)), update_width=True)

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

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.console.selected = event.row_key.value
            snapshot = self.console.snapshot
            if snapshot is not None and snapshot.fleet is not None:
                self._draw_detail(snapshot.fleet, len(self._rows))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.console.open_server(event.row_key.value)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = event.column_key.value
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = key, False
        self.redraw()

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
        table = self.query_one(DataTable)
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1)

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
        self.query_one(DataTable).focus()
        self.redraw()
        self.console.refresh_status()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()
        if not self.filter_text:
            event.input.display = False
