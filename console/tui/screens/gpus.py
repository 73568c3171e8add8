"""GPUs screen: what the probe sees on each GPU (memory, other users) and the plan it makes from that."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.tui import fmt
from console.tui.model import Snapshot
from console.tui.screens.base import ConsoleScreen

# Preferred column order; any other scalar key a probe reports is shown after these.
_GPU_COLUMNS = (
    ("index", "GPU"),
    ("name", "NAME"),
    ("total_mib", "TOTAL"),
    ("free_mib", "FREE"),
    ("used_mib", "USED"),
    ("used_by_others_mib", "OTHERS"),
    ("compute_capability", "CC"),
)
_MIB_KEYS = {"total_mib", "free_mib", "used_mib", "used_by_others_mib"}


def _gpus(probe: dict[str, Any]) -> list[dict[str, Any]]:
    for key in ("gpus", "devices"):
        value = probe.get(key)
        if isinstance(value, list):
            return [g for g in value if isinstance(g, dict)]
    inner = probe.get("probe")
    return _gpus(inner) if isinstance(inner, dict) else []


def _cell(key: str, value: Any) -> str:
    if key in _MIB_KEYS and isinstance(value, (int, float)):
        return fmt.mib(float(value))
    if isinstance(value, (list, tuple)):
        return ".".join(map(str, value)) if key == "compute_capability" else ", ".join(map(str, value))
    return "-" if value is None else str(value)


def gpu_table(gpus: list[dict[str, Any]]) -> Table:
    keys = [k for k, _ in _GPU_COLUMNS if any(k in g for g in gpus)]
    extra = sorted(
        {k for g in gpus for k, v in g.items() if k not in keys and not isinstance(v, (dict, list))}
    )
    labels = dict(_GPU_COLUMNS)
    table = Table(expand=True)
    for key in keys + extra:
        table.add_column(labels.get(key, key.upper()))
    for gpu in gpus:
        table.add_row(*(_cell(k, gpu.get(k)) for k in keys + extra))
    return table


def other_users(gpus: list[dict[str, Any]]) -> Text:
    text = Text()
    for gpu in gpus:
        procs = gpu.get("processes") or gpu.get("other_processes") or []
        for proc in procs if isinstance(procs, list) else []:
            if isinstance(proc, dict):
                text.append(
                    f"GPU {gpu.get('index', '?')}: pid {proc.get('pid', '?')} "
                    f"{proc.get('name', '')} {fmt.mib(proc.get('used_mib'))}\n"
                )
    return text or Text("no other processes on the GPUs", style="dim")


def plan_text(plan: Any) -> Text:
    if plan is None:
        return Text("no plan reported", style="dim")
    if isinstance(plan, str):
        return Text(plan)
    return Text(json.dumps(plan, indent=2, sort_keys=True, default=str))


class GpusScreen(ConsoleScreen):
    MODE = "gpus"
    BINDINGS = [*ConsoleScreen.BINDINGS, Binding("escape", "app.switch_screen_to('fleet')", "Back")]

    def compose(self):
        yield from self.compose_header()
        with VerticalScroll(id="gpus-body"):
            yield Static("", id="gpus-table")
            yield Static("Other users", classes="section")
            yield Static("", id="gpus-others")
            yield Static("Plan", classes="section")
            yield Static("", id="gpus-plan")
        yield from self.compose_footer()

    def poll_request(self):
        return lambda source: source.probe()

    def show(self, snapshot: Snapshot) -> None:
        if snapshot.extra_error:
            self.query_one("#gpus-table", Static).update(
                Text(f"probe: {snapshot.extra_error}", style="bold red")
            )
            return
        probe = snapshot.extra
        if not isinstance(probe, dict):
            return
        gpus = _gpus(probe)
        if gpus:
            self.query_one("#gpus-table", Static).update(gpu_table(gpus))
        else:
            platform = probe.get("platform") or (probe.get("probe") or {}).get("platform") or "cpu"
            self.query_one("#gpus-table", Static).update(
                Text(f"no GPU found (platform: {platform}); servers run with --device cpu", style="yellow")
            )
        self.query_one("#gpus-others", Static).update(other_users(gpus))
        self.query_one("#gpus-plan", Static).update(plan_text(probe.get("plan")))
