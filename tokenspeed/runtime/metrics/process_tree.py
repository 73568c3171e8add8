"""What a whole server costs the machine: CPU seconds and resident memory of every process it runs.

`process_*` (prometheus_client's ProcessCollector) covers only the HTTP front end; the scheduler ranks and
the DP controller are its children and hold most of a server's memory (the model, the KV pool). These
series add them up, read at scrape time, with the process kind as a label:

    tokenspeed:server_process_cpu_seconds_total{model_name, process}    user + system CPU seconds
    tokenspeed:server_process_resident_memory_bytes{model_name, process}
    tokenspeed:server_processes{model_name, process}                   how many processes

`process` is "front_end" for the HTTP process, "scheduler" for scheduler ranks and everything below them,
"dp_controller" for the data-parallel controller, "other" for helpers (multiprocessing's resource tracker). A process that ends takes its CPU seconds with it, which
Prometheus' rate() reads as a counter reset (it only happens when the server's processes change).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

FRONT_END = "front_end"


def process_kind(child_name: str | None) -> str:
    """The `process` label of a child of the front end, from its name in ServerState.child_pids; "other"
    for a child the server did not start as a rank (multiprocessing's resource tracker)."""
    if child_name is None:
        return "other"
    return "dp_controller" if "controller" in child_name else "scheduler"


class ProcessTreeCollector:
    """A prometheus_client collector; `child_names` gives {pid: name} of the front end's direct children."""

    def __init__(self, prefix: str, labels: dict[str, str], child_names: Callable[[], dict[int, str]]):
        self.prefix = prefix
        self.labels = labels
        self.child_names = child_names
        self._root = psutil.Process(os.getpid())
        self._procs: dict[int, psutil.Process] = {}  # kept: psutil caches what it can between reads

    def describe(self) -> Iterable:
        return []

    def _tree(self) -> list[tuple[str, psutil.Process]]:
        names = self.child_names()
        out = [(FRONT_END, self._root)]
        try:
            children = self._root.children()
        except psutil.Error:
            return out
        for child in children:
            kind = process_kind(names.get(child.pid))
            out.append((kind, child))
            try:
                out.extend((kind, p) for p in child.children(recursive=True))
            except psutil.Error:
                continue
        return out

    def collect(self) -> Iterable:
        keys = list(self.labels)
        cpu = CounterMetricFamily(
            self.prefix + "server_process_cpu_seconds", "CPU seconds of the server's processes, by kind.",
            labels=[*keys, "process"],
        )  # fmt: skip
        rss = GaugeMetricFamily(
            self.prefix + "server_process_resident_memory_bytes", "Resident memory of the server's processes, by kind.",
            labels=[*keys, "process"],
        )  # fmt: skip
        count = GaugeMetricFamily(
            self.prefix + "server_processes", "Processes of the server, by kind.", labels=[*keys, "process"]
        )
        totals: dict[str, list[float]] = {}
        for kind, proc in self._tree():
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    memory = proc.memory_info().rss
            except psutil.Error:
                continue  # it ended between the listing and the read
            row = totals.setdefault(kind, [0.0, 0.0, 0.0])
            row[0] += times.user + times.system
            row[1] += memory
            row[2] += 1
        values = list(self.labels.values())
        for kind, (seconds, memory, n) in sorted(totals.items()):
            cpu.add_metric([*values, kind], seconds)
            rss.add_metric([*values, kind], memory)
            count.add_metric([*values, kind], n)
        return [cpu, rss, count]
