"""Server screen: history plots of the cursor server, its resolved ServerArgs and its Mapping."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from console.tui import fmt
from console.tui.history_window import updated_history
from console.tui.model import History, Metrics, Snapshot
from console.tui.screens.base import ConsoleScreen
from console.tui.source import DataSource, SourceError
from console.tui.widgets.panel import Shown, TextPanel
from console.tui.widgets.plot import MetricPlot

HISTORY_SECONDS = 300.0

# (widget id, title, metric key, renderer, a 0..1 ratio)
PLOTS = (
    ("plot-tps", "tokens/s", "gen_throughput", fmt.rate, False),
    ("plot-running", "running", "running", fmt.count, False),
    ("plot-waiting", "waiting", "waiting", fmt.count, False),
    ("plot-kv", "KV usage", "kv_usage", fmt.percent, True),
    ("plot-hit", "prefix hit rate", "prefix_hit_rate", fmt.percent, True),
    ("plot-ttft50", "TTFT p50", "ttft_p50", fmt.latency, False),
    ("plot-ttft99", "TTFT p99", "ttft_p99", fmt.latency, False),
    ("plot-itl50", "ITL p50", "itl_p50", fmt.latency, False),
    ("plot-itl99", "ITL p99", "itl_p99", fmt.latency, False),
)

# Keys of /get_server_info that are live state, not arguments.
_LIVE_KEYS = {
    "mapping",
    "state",
    "live",
    "stats",
    "version",
    "internal_states",
    "status",
    "uptime_s",
    "pid",
    "child_pids",
    "num_inflight_requests",
    "max_total_num_tokens",
    "max_req_input_len",
}


@dataclass(frozen=True)
class ServerData:
    name: str
    history: History
    info: dict[str, Any] | None
    info_error: str | None


def split_info(info: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(resolved ServerArgs, Mapping) out of a /get_server_info answer, whichever layout it uses."""
    args = info.get("server_args")
    if not isinstance(args, dict):
        args = {k: v for k, v in info.items() if k not in _LIVE_KEYS and not isinstance(v, dict)}
    mapping = info.get("mapping")
    if mapping is None and isinstance(info.get("server_args"), dict):
        mapping = info["server_args"].get("mapping")
    return args, mapping


def mapping_text(mapping: Any) -> str:
    if mapping is None:
        return "(the server did not report a mapping)"
    if isinstance(mapping, dict) and isinstance(mapping.get("table"), str):
        return mapping["table"]
    if isinstance(mapping, dict):
        return "\n".join(f"{key}: {json.dumps(value)}" for key, value in mapping.items())
    return str(mapping)


def latency_text(m: Metrics | None) -> str:
    """p50/p99 over the window, the very values of the fleet table: TTFT and ITL (also plotted) beside the
    queue wait, which tells whether a slow first token was spent waiting for a batch slot or computing the
    prefill."""
    if m is None:
        return "(no current metrics)"
    return "  ".join(
        f"{label} {fmt.pair(fmt.latency(p50), fmt.latency(p99))}"
        for label, p50, p99 in (
            ("TTFT", m.ttft_p50, m.ttft_p99),
            ("ITL", m.itl_p50, m.itl_p99),
            ("queue", m.queue_p50, m.queue_p99),
        )
    )


def processes_text(processes: tuple[dict[str, Any], ...]) -> Text:
    """One line per process of the server (nvitop-like): pid, role, CPU % of one core, resident memory, and
    on GPU machines its GPU memory and SM utilisation ("-" without a GPU or an NVML sample)."""
    if not processes:
        return Text("(no process running)", style="dim")
    text = Text(f"{'PID':>7}  {'CPU':>5}  {'RSS':>9}  {'GPU MEM':>9}  {'SM':>4}  ROLE\n", style="bold")
    for p in processes:
        cpu, sm = p.get("cpu_percent"), p.get("gpu_sm_percent")
        text.append(
            f"{p.get('pid', '?'):>7}  {fmt.DASH if cpu is None else f'{cpu:.0f}%':>5}  "
            f"{fmt.mib(p.get('rss_mib')):>9}  {fmt.mib(p.get('gpu_mib')):>9}  "
            f"{fmt.DASH if sm is None else f'{sm:.0f}%':>4}  {p.get('name', '')}\n"
        )
    return text


def live_text(info: dict[str, Any]) -> str:
    """The server's own view of itself: status, in-flight requests, KV pages per scheduler rank."""
    lines = []
    head = [
        f"{k}: {info[k]}" for k in ("status", "num_inflight_requests", "max_total_num_tokens") if k in info
    ]
    if head:
        lines.append("  ".join(head))
    for rank in info.get("internal_states") or []:
        if not isinstance(rank, dict):
            continue
        lines.append(
            f"dp {rank.get('dp_rank', '?')}: running {rank.get('num_running', '-')} waiting {rank.get('num_waiting', '-')}"
            f"  KV pages {rank.get('kv_pages_used', '-')}/{rank.get('kv_pages_total', '-')}"
            f"  prefix hits {rank.get('prefix_cache_hits', '-')}/{rank.get('prefix_cache_queries', '-')}"
            f"  preemptions {rank.get('num_preemptions', '-')}"
        )
        if info.get("speculative_algorithm"):
            lines.append(f"  {spec_text(info['speculative_algorithm'], rank)}")
    return "\n".join(lines) or "(the server reported no live state)"


def spec_text(algorithm: str, rank: dict[str, Any]) -> str:
    """Speculative decoding of one rank: mean acceptance length (tokens per verify step) and drafts kept."""
    drafted, accepted = rank.get("spec_num_draft_tokens") or 0, rank.get("spec_num_accepted_tokens") or 0
    length = rank.get("spec_mean_acceptance_length") or 0.0
    if not rank.get("spec_num_drafts"):
        return f"speculative {algorithm}: no drafts verified yet"
    return f"speculative {algorithm}: acceptance length {length:.2f}  ({accepted}/{drafted} drafted tokens accepted)"


def planned_vs_running(plan: dict[str, Any] | None, info: dict[str, Any] | None) -> str:
    """The supervisor's plan next to what the server reports: KV tokens, memory fraction, CUDA graphs."""
    if not plan:
        return ""
    info = info or {}
    args, _ = split_info(info) if info else ({}, None)

    def graphs(sizes: Any) -> str:
        return f"{len(sizes)} sizes up to {max(sizes)}" if isinstance(sizes, list) and sizes else "none"

    rows = [
        ("KV tokens", plan.get("kv_tokens"), info.get("max_total_num_tokens")),
        ("gpu_memory_utilization", plan.get("gpu_memory_utilization"), args.get("gpu_memory_utilization")),
        (
            "CUDA graphs",
            graphs(plan.get("cudagraph_capture_sizes")),
            graphs(args.get("cudagraph_capture_sizes")) if args else None,
        ),
    ]
    lines = [
        f"{what}: planned {planned}, running {'-' if running is None else running}"
        for what, planned, running in rows
    ]
    if plan.get("fits") is False and plan.get("reason"):
        lines.append(f"plan refused: {plan['reason']}")
    return "\n".join(lines)


class ServerScreen(ConsoleScreen):
    MODE = "server"
    NEEDS_SERVER = True
    BINDINGS = [*ConsoleScreen.BINDINGS, Binding("escape", "app.switch_screen_to('fleet')", "Back")]

    def __init__(self) -> None:
        super().__init__()
        self._args_for: tuple[str, dict[str, Any]] | None = None
        self._history: tuple[str, History] | None = None  # the last history drawn, by server: the next poll
        # fetches only the samples newer than its own

    def compose(self):
        yield from self.compose_header()
        yield TextPanel("", id="server-title", classes="title")
        with Horizontal(id="server-body"):
            with VerticalScroll(id="server-plots"):
                for plot_id, title, _key, render, ratio in PLOTS:
                    yield MetricPlot(title, render, ratio=ratio, id=plot_id)
            with VerticalScroll(id="server-side"):
                yield TextPanel("Latency p50/p99", classes="section", id="server-latency-title")
                yield TextPanel("", id="server-latency")
                yield Static("Processes", classes="section")
                yield TextPanel("", id="server-processes")
                yield Static("Live state", classes="section")
                yield TextPanel("", id="server-live")
                yield Static("Mapping", classes="section")
                yield TextPanel("", id="server-mapping")
                yield Static("ServerArgs (resolved)", classes="section")
                table = DataTable(id="server-args", cursor_type="row", zebra_stripes=True)
                table.add_columns("argument", "value")
                yield table
        yield from self.compose_footer()

    def poll_request(self):
        name = self.console.selected
        if name is None:
            return None

        held = self._history
        # Only a live source's samples stay as they were; a replay seeks, so it is fetched whole.
        kept = held[1] if held is not None and held[0] == name and self.console.source.now is None else None

        def fetch(source: DataSource) -> ServerData:
            history = updated_history(source, name, HISTORY_SECONDS, kept, time.time())
            info, info_error = None, None
            try:
                info = source.info(name)
            except SourceError as exc:
                info_error = str(exc)
            return ServerData(name, history, info, info_error)

        return fetch

    def show(self, snapshot: Snapshot) -> None:
        name = self.console.selected
        fleet = snapshot.fleet
        server = fleet.server(name) if fleet is not None else None
        title = Text(f"{name or 'no server selected'}", style="bold")
        if server is not None:
            title.append(f"  {server.state}", style="green" if server.health == "ok" else "red")
            title.append(
                f"  node {server.node}  GPUs {','.join(map(str, server.gpus)) or 'cpu'}"
                f"  pid {server.pid or '-'}  up {fmt.duration(server.uptime_s)}  restarts {server.restarts}"
                f"  {server.url}"
            )
            if server.error:
                title.append(f"\nunreachable: {server.error}", style="bold red")
        if snapshot.extra_error:
            title.append(f"\nhistory: {snapshot.extra_error}", style="red")
        self._update("#server-title", title)
        data = snapshot.extra
        if not isinstance(data, ServerData) or data.name != name:
            return
        self._history = (data.name, data.history)
        for plot_id, _title, key, _render, _ratio in PLOTS:
            self.query_one(f"#{plot_id}", MetricPlot).update_series(data.history.series(key))
        self._update(
            "#server-processes",
            Text("(a replay: process figures come from a live supervisor)", style="dim")
            if self.console.source.now is not None
            else processes_text(server.processes if server is not None else ()),
        )
        window = fleet.window_label if fleet is not None else "30s"
        self._update("#server-latency-title", f"Latency p50/p99 over {window}")
        self._update("#server-latency", latency_text(server.metrics if server is not None else None))
        planned = planned_vs_running(server.plan if server is not None else None, data.info)
        if data.info is not None:
            live = live_text(data.info)
            self._update("#server-live", f"{live}\n{planned}" if planned else live)
            args, mapping = split_info(data.info)
            if self._args_for != (data.name, args):
                # Arguments only change with a new process: redraw the long table only then.
                self._draw_info(args, mapping)
                self._args_for = (data.name, args)
        elif data.info_error:
            self._update("#server-live", Text(f"info: {data.info_error}", style="red"))

    def _update(self, widget_id: str, content: Shown) -> None:
        self.query_one(widget_id, TextPanel).show(content)

    def _draw_info(self, args: dict[str, Any], mapping: Any) -> None:
        self._update("#server-mapping", mapping_text(mapping))
        table = self.query_one("#server-args", DataTable)
        table.clear()
        for key in sorted(args):
            value = args[key]
            table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
