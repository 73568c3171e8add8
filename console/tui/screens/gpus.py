"""GPUs screen: what the probe sees on each GPU (memory; whose: this fleet's servers, other fleets, unknown
processes) and the plan of a restart now, made with this fleet's own memory counted free."""

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
    for gpu in gpus:
        if "used_mib" not in gpu and isinstance(gpu.get("total_mib"), (int, float)):
            gpu["used_mib"] = gpu["total_mib"] - float(gpu.get("free_mib") or 0.0)
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


def owners_text(owners: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> Text:
    """Per GPU, whose memory it holds: this fleet's servers, other fleets' servers, unknown processes."""
    by_index = {o.get("index"): o for o in owners if isinstance(o, dict)}
    text = Text()
    for gpu in gpus:
        index = gpu.get("index", "?")
        owner = by_index.get(index)
        if owner is None:  # a probe without process lists (an older supervisor, or NVML refused them)
            others = gpu.get("used_by_others_mib")
            if isinstance(others, (int, float)) and others > 0:
                text.append(f"GPU {index}: {fmt.mib(float(others))} used by processes\n", style="yellow")
            continue
        parts: list[tuple[str, str]] = []
        own = owner.get("own") or {}
        if own:
            listed = ", ".join(f"{name} {fmt.mib(float(mib))}" for name, mib in sorted(own.items()))
            parts.append((f"this fleet: {listed}", "green"))
        fleets = owner.get("other_fleets") or {}
        if fleets:
            listed = ", ".join(f"{name} {fmt.mib(float(mib))}" for name, mib in sorted(fleets.items()))
            parts.append((f"other fleets: {listed}", "cyan"))
        unknown = owner.get("unknown") or {}
        if unknown:
            listed = ", ".join(f"pid {pid} {fmt.mib(float(mib))}" for pid, mib in sorted(unknown.items()))
            parts.append((f"unknown others: {listed}", "yellow"))
        if not parts:
            parts.append(("no processes", "dim"))
        text.append(f"GPU {index}: ")
        for i, (part, style) in enumerate(parts):
            text.append(("; " if i else "") + part, style=style)
        text.append("\n")
    return text or Text("no GPU processes", style="dim")


_PLAN_COLUMNS = (
    ("name", "SERVER"),
    ("device", "DEVICE"),
    ("gpus", "GPUS"),
    ("gpu_memory_utilization", "MEM UTIL"),
    ("weights_gib", "WEIGHTS GiB"),
    ("kv_gib", "KV GiB"),
    ("kv_tokens", "KV TOKENS"),
    ("concurrent_seqs", "SEQS"),
    ("max_num_seqs", "MAX SEQS"),
    ("max_cudagraph_capture_size", "GRAPHS"),
)


def _plan_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return str(value)


def plan_text(plan: Any) -> Table | Text:
    """The planner's answer: one row per server, then each server's notes and any refusal."""
    if plan is None:
        return Text("no plan reported", style="dim")
    if isinstance(plan, str):
        return Text(plan)
    servers = plan.get("servers") if isinstance(plan, dict) else None
    if not isinstance(servers, list):
        return Text(json.dumps(plan, indent=2, sort_keys=True, default=str))
    verdict = plan.get("verdict") or (
        "fits" if plan.get("fits", True) else f"REFUSED: {plan.get('reason') or 'see the servers below'}"
    )
    table = Table(title=f"fleet {plan.get('fleet', '?')}: {verdict}", expand=True, title_justify="left")
    for _key, label in _PLAN_COLUMNS:
        table.add_column(label)
    table.add_column("FITS")
    for server in servers:
        if not isinstance(server, dict):
            continue
        fits = Text("yes", style="green") if server.get("fits", True) else Text("no", style="bold red")
        table.add_row(*(_plan_cell(server.get(k)) for k, _ in _PLAN_COLUMNS), fits)
    notes = [
        f"{server.get('name')}: {note}"
        for server in servers
        if isinstance(server, dict)
        for note in [*(server.get("notes") or []), *([server["reason"]] if server.get("reason") else [])]
    ]
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


class GpusScreen(ConsoleScreen):
    MODE = "gpus"
    BINDINGS = [*ConsoleScreen.BINDINGS, Binding("escape", "app.switch_screen_to('fleet')", "Back")]

    def __init__(self) -> None:
        super().__init__()
        self._drawn: str | None = None  # what the tables were drawn from (the probe, less its timestamp)

    def compose(self):
        yield from self.compose_header()
        with VerticalScroll(id="gpus-body"):
            yield Static("", id="gpus-table")
            yield Static("Whose memory", classes="section")
            yield Static("", id="gpus-others")
            yield Static("Plan", classes="section")
            yield Static("", id="gpus-plan")
        yield from self.compose_footer()

    def poll_request(self):
        return lambda source: source.probe()

    def on_screen_resume(self) -> None:
        self._drawn = None  # the terminal may have changed size meanwhile: draw the next probe again
        super().on_screen_resume()

    def show(self, snapshot: Snapshot) -> None:
        probe = snapshot.extra
        # The tables are Rich renderables, costly to lay out: redrawn only when what they show changed.
        drawn = json.dumps([snapshot.extra_error, _shown_part(probe)], sort_keys=True, default=str)
        if drawn == self._drawn:
            return
        self._drawn = drawn
        if snapshot.extra_error:
            self.query_one("#gpus-table", Static).update(
                Text(f"probe: {snapshot.extra_error}", style="bold red")
            )
            return
        if not isinstance(probe, dict):
            return
        gpus = _gpus(probe)
        reading = probe.get("probe") if isinstance(probe.get("probe"), dict) else probe
        host = f"{reading.get('hostname', '?')} ({reading.get('kind', '?')})"
        if gpus:
            table = gpu_table(gpus)
            table.title = f"GPUs on {host}"
            table.title_justify = "left"
            self.query_one("#gpus-table", Static).update(table)
        else:
            note = reading.get("note") or "no GPU readings"
            self.query_one("#gpus-table", Static).update(
                Text(f"no GPU found on {host}: {note}; servers run with --device cpu", style="yellow")
            )
        owners = probe.get("owners") if isinstance(probe.get("owners"), list) else []
        self.query_one("#gpus-others", Static).update(owners_text(owners, gpus))
        plan = probe.get("plan")
        if plan is None and probe.get("error"):
            self.query_one("#gpus-plan", Static).update(Text(f"plan: {probe['error']}", style="bold red"))
        else:
            self.query_one("#gpus-plan", Static).update(plan_text(plan))


def _shown_part(probe: Any) -> Any:
    """The probe less its reading time, which changes on every poll and is not drawn."""
    if not isinstance(probe, dict):
        return probe
    part = {k: v for k, v in probe.items() if k != "taken_at"}
    if isinstance(part.get("probe"), dict):
        part["probe"] = {k: v for k, v in part["probe"].items() if k != "taken_at"}
    return part
