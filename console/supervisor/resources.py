"""What each server's processes cost the machine (nvitop-like): CPU %, resident memory, GPU memory and SM %.

The supervisor samples every process of a server (the `tokenspeed serve` process and everything it
started: scheduler ranks, the DP controller) every `interval_s`; CPU % is measured between two samples,
so the first sample of a process reads None. GPU memory and SM utilisation per process come from NVML's
per-process queries (gpu_processes.py), read less often, and only when the fleet has GPUs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import psutil

from console.supervisor.gpu_processes import GpuProcessUsage, read_gpu_processes

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    name: str  # its role: "front end", "scheduler / controller", "body parser", "resource tracker"
    cpu_percent: float | None  # of one core, since the previous sample
    rss_mib: float
    gpu_mib: float | None = None  # None: no GPU memory reading (CPU fleet, or NVML does not list it)
    gpu_sm_percent: float | None = None  # SM utilisation on its GPU(s); None: no NVML sample

    def to_json(self) -> dict:
        return asdict(self)


class ProcessSampler:
    def __init__(self, interval_s: float = 2.0, gpu_interval_s: float = 5.0):
        self.interval_s = interval_s
        self.gpu_interval_s = gpu_interval_s
        self._procs: dict[int, psutil.Process] = {}  # kept between samples: cpu_percent needs the last one
        self._next_at = 0.0
        self._gpu_next_at = 0.0
        self.gpu: dict[int, GpuProcessUsage] = {}  # pid -> memory and SM %, from the last NVML reading
        self.usage: dict[str, list[ProcessUsage]] = {}
        self._cpu_pids: set[int] = set()  # processes with a CPU sample to measure from
        self._roles: dict[int, str] = {}  # a process's role, read once (its command line does not change)

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def gpu_due(self, now: float) -> bool:
        if now < self._gpu_next_at:
            return False
        self._gpu_next_at = now + self.gpu_interval_s
        return True

    def read_gpus(self) -> None:
        """NVML's per-process memory and SM utilisation (blocking: call it off the event loop)."""
        try:
            self.gpu = read_gpu_processes()
        except Exception:  # a broken driver must not take the supervisor down; the columns stay empty
            return

    def sample(self, roots: dict[str, list[int]]) -> None:
        """`roots`: server -> the pids the supervisor started for it."""
        self._next_at = time.time() + self.interval_s
        seen: set[int] = set()
        usage: dict[str, list[ProcessUsage]] = {}
        for server, pids in roots.items():
            rows = []
            for pid in pids:
                for proc in self._family(pid):
                    seen.add(proc.pid)
                    row = self._usage(proc, pid)
                    if row is not None:
                        rows.append(row)
            usage[server] = rows
        self._procs = {pid: p for pid, p in self._procs.items() if pid in seen}
        self._roles = {pid: role for pid, role in self._roles.items() if pid in seen}
        self._cpu_pids &= seen
        self.usage = usage

    def _family(self, pid: int) -> list[psutil.Process]:
        try:
            root = self._procs.get(pid) or psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        # The cached object keeps the CPU times of the previous sample.
        return [self._procs.setdefault(p.pid, p) for p in family]

    def _usage(self, proc: psutil.Process, root_pid: int) -> ProcessUsage | None:
        try:
            with proc.oneshot():
                first = proc.pid not in self._cpu_pids
                cpu = proc.cpu_percent(None)
                rss = proc.memory_info().rss / _MIB
                name = self._roles.get(proc.pid) or _role(proc, root_pid)
        except psutil.Error:
            return None
        self._cpu_pids.add(proc.pid)
        self._roles[proc.pid] = name
        gpu = self.gpu.get(proc.pid, GpuProcessUsage())
        return ProcessUsage(proc.pid, name, None if first else cpu, rss, gpu.memory_mib, gpu.sm_percent)


# Children of the front end that are neither scheduler ranks nor the DP controller, by their command line:
# Python's multiprocessing resource tracker (started with the first spawned child) and the process that
# parses large request bodies (tokenspeed/runtime/entrypoints/body_parser.py, started with the first one).
_HELPERS = (("multiprocessing.resource_tracker", "resource tracker"), ("entrypoints.body_parser", "body parser"))


def _role(proc: psutil.Process, root_pid: int) -> str:
    """The root is the server's front end (HTTP, tokenizer); its children are scheduler ranks or, with
    attention DP, the DP controller (spawned interpreters whose command lines do not say which), or one
    of the helpers above."""
    if proc.pid == root_pid:
        return "front end"
    command = " ".join(proc.cmdline())
    for marker, role in _HELPERS:
        if marker in command:
            return role
    return f"child of {root_pid}" if proc.ppid() != root_pid else "scheduler / controller"
