"""GPU readings through NVML (nvidia-ml-py): per GPU its name, total, free, and the compute processes
on it (pid and memory), which `console.gpu_owners` matches to fleets.

A `Probe` is plain data, so it can be recorded to JSON on one machine and planned against on another
(`tokenspeed profile plan --gpus-from reading.json`); tests plan against recorded H200 readings. With
`TOKENSPEED_GPU_READINGS=reading.json` in its environment, `probe_gpus()` returns that recorded reading
instead of asking NVML (read afresh at each call), so a supervisor can be planned against one.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_MIB = 1024 * 1024
READINGS_ENV = "TOKENSPEED_GPU_READINGS"


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML lists on a GPU (its pid as this machine's NVML reports it)."""

    pid: int
    used_mib: float


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    total_mib: float
    free_mib: float
    used_by_others_mib: float  # memory of compute processes already on the GPU
    compute_capability: tuple[int, int] | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def used_mib(self) -> float:
        return self.total_mib - self.free_mib


@dataclass(frozen=True)
class Probe:
    kind: str  # "nvidia" or "cpu"
    hostname: str
    gpus: tuple[GpuReading, ...] = ()
    taken_at: float = field(default_factory=time.time)
    note: str | None = None  # why there are no readings (no NVML, no driver), for the operator

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Probe:
        gpus = []
        for g in data.get("gpus", []):
            cc = g.get("compute_capability")
            procs = tuple(GpuProcess(int(p["pid"]), float(p["used_mib"])) for p in g.get("processes", []))
            gpus.append(
                GpuReading(
                    index=int(g["index"]),
                    name=str(g["name"]),
                    total_mib=float(g["total_mib"]),
                    free_mib=float(g.get("free_mib", g["total_mib"])),
                    used_by_others_mib=float(g.get("used_by_others_mib", 0.0)),
                    compute_capability=tuple(cc) if cc else None,
                    processes=procs,
                )
            )
        kind = data.get("kind", "nvidia" if gpus else "cpu")
        return cls(
            kind, data.get("hostname", "recorded"), tuple(gpus), data.get("taken_at", 0.0), data.get("note")
        )

    def by_index(self) -> dict[int, GpuReading]:
        return {g.index: g for g in self.gpus}


def load_probe(path: str | Path) -> Probe:
    """Recorded readings: a Probe's JSON, or a bare list of GPU readings."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):
        data = {"gpus": data}
    return Probe.from_dict(data)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpus() -> Probe:
    """Read every GPU of this machine; a `cpu` probe (with the reason) where NVML finds none."""
    recorded = os.environ.get(READINGS_ENV)
    if recorded:
        return load_probe(recorded)
    host = socket.gethostname()
    try:
        import pynvml
    except ImportError:
        return Probe("cpu", host, note="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA GPU here
        return Probe("cpu", host, note=f"NVML unavailable: {exc}")
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                procs = tuple(GpuProcess(int(p.pid), (p.usedGpuMemory or 0) / _MIB) for p in listed)
                others = sum(p.used_mib for p in procs)
            except pynvml.NVMLError:
                procs = ()
                others = (memory.total - memory.free) / _MIB
            try:
                capability = tuple(int(x) for x in pynvml.nvmlDeviceGetCudaComputeCapability(handle))
            except pynvml.NVMLError:
                capability = None
            readings.append(
                GpuReading(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    total_mib=memory.total / _MIB,
                    free_mib=memory.free / _MIB,
                    used_by_others_mib=others,
                    compute_capability=capability,
                    processes=procs,
                )
            )
    finally:
        pynvml.nvmlShutdown()
    if not readings:
        return Probe("cpu", host, note="NVML reports no GPU")
    return Probe("nvidia", host, tuple(readings))
