"""What each process does on the GPUs (nvitop-like): memory and SM utilisation per pid, from NVML.

NVML answers per device: `nvmlDeviceGetComputeRunningProcesses` (memory each process holds) and
`nvmlDeviceGetProcessUtilization` (SM and memory-controller samples per process, several per process
over the driver's last few seconds). The parsing is pure, over pynvml's own return types, so it is tested
on a machine without a GPU; only `read_gpu_processes` talks to the driver.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_MIB = 1024 * 1024
# How far back utilisation samples count: the sampler reads every few seconds, a rank's SM share is
# the newest sample within this window.
SAMPLE_WINDOW_S = 10.0


@dataclass(frozen=True)
class GpuProcessUsage:
    memory_mib: float | None = None  # None: NVML does not report it (WDDM, or not listed)
    sm_percent: float | None = None  # None: no utilisation sample in the window


def memory_by_pid(listed: Iterable[Any]) -> dict[int, float | None]:
    """pid -> MiB from `nvmlDeviceGetComputeRunningProcesses` (objects with `pid` and `usedGpuMemory`,
    which pynvml sets to None where NVML has no figure)."""
    out: dict[int, float | None] = {}
    for proc in listed:
        used = getattr(proc, "usedGpuMemory", None)
        out[int(proc.pid)] = None if used is None else used / _MIB
    return out


def sm_by_pid(samples: Iterable[Any]) -> dict[int, float]:
    """pid -> SM % from `nvmlDeviceGetProcessUtilization` (c_nvmlProcessUtilizationSample_t): the newest
    sample of each process; a value over 100 is NVML's "not available" and is left out."""
    newest: dict[int, tuple[int, float]] = {}
    for sample in samples:
        pid, stamp, sm = int(sample.pid), int(sample.timeStamp), int(sample.smUtil)
        if sm > 100:
            continue
        if pid not in newest or stamp > newest[pid][0]:
            newest[pid] = (stamp, float(sm))
    return {pid: sm for pid, (_, sm) in newest.items()}


def merge_devices(
    devices: Iterable[tuple[dict[int, float | None], dict[int, float]]],
) -> dict[int, GpuProcessUsage]:
    """One figure per process over every device it uses: memory added up, SM % the busiest device's."""
    memory: dict[int, float | None] = {}
    sm: dict[int, float] = {}
    for mem, util in devices:
        for pid, mib in mem.items():
            known = memory.get(pid)
            memory[pid] = mib if known is None else (known if mib is None else known + mib)
        for pid, percent in util.items():
            sm[pid] = max(percent, sm.get(pid, 0.0))
    return {pid: GpuProcessUsage(memory.get(pid), sm.get(pid)) for pid in memory.keys() | sm.keys()}


def read_gpu_processes() -> dict[int, GpuProcessUsage]:
    """Every GPU process of this machine; {} without a GPU (or NVML). Blocking: call it off the event loop."""
    from console.probe import READINGS_ENV, probe_gpus

    if os.environ.get(READINGS_ENV):  # recorded readings stand in for NVML: memory only
        recorded = probe_gpus()
        return {p.pid: GpuProcessUsage(p.used_mib) for g in recorded.gpus for p in g.processes}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver, no GPU: every column reads "-"
        return {}
    since_us = int((time.time() - SAMPLE_WINDOW_S) * 1e6)
    devices = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mem = memory_by_pid(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except pynvml.NVMLError:
                mem = {}
            try:
                util = sm_by_pid(pynvml.nvmlDeviceGetProcessUtilization(handle, since_us))
            except pynvml.NVMLError:  # NotFound: no process ran a kernel in the window
                util = {}
            devices.append((mem, util))
    finally:
        pynvml.nvmlShutdown()
    return merge_devices(devices)
