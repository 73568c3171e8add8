"""What hardware this process runs on: NVIDIA, AMD or CPU only.

`current_platform()` answers once per process (NVML initialisation is not free and the answer
cannot change while the process lives); the cache sits on the function, not in a module global.
Machines without a GPU, or without the NVML library, report `cpu` without raising or warning.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Literal

PlatformKind = Literal["nvidia", "amd", "cpu"]

# Hopper is compute capability 9.0; everything newer (Blackwell 10.x, 12.x) counts as "Hopper or newer".
_HOPPER = (9, 0)
_BYTES_PER_GIB = 1024**3


@dataclass(frozen=True)
class Platform:
    kind: PlatformKind
    device_name: str
    compute_capability: tuple[int, int] | None
    is_hopper_or_newer: bool
    num_gpus: int

    @property
    def is_nvidia(self) -> bool:
        return self.kind == "nvidia"

    @property
    def is_amd(self) -> bool:
        return self.kind == "amd"

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_hopper_plus(self) -> bool:
        """The seed's spelling of `is_hopper_or_newer`."""
        return self.is_hopper_or_newer

    def gpu_memory_capacity_gb(self) -> float | None:
        """Smallest total memory over the visible GPUs, in GiB; None where there is no GPU.

        The smallest, because every rank of a server must fit the same shard on its own GPU.
        """
        totals = _gpu_total_bytes(self.kind)
        if not totals:
            return None
        return min(totals) / _BYTES_PER_GIB

    def gpu_memory_capacity_mb(self) -> float | None:
        """Same as `gpu_memory_capacity_gb`, in MiB (the unit of the seed's 25 000 threshold)."""
        gb = self.gpu_memory_capacity_gb()
        return None if gb is None else gb * 1024


def _visible_indices(count: int) -> list[int]:
    """NVML numbers every GPU of the machine; honour CUDA_VISIBLE_DEVICES when it lists integers."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    indices: list[int] = []
    for part in visible.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            # UUIDs or MIG names: fall back to every device rather than guessing a mapping.
            return list(range(count))
        if int(part) < count:
            indices.append(int(part))
    return indices


def _nvml_devices():
    """Yield NVML handles of the visible GPUs; empty where NVML is missing or finds no driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA GPU here
        return []
    try:
        count = pynvml.nvmlDeviceGetCount()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in _visible_indices(count)]
    except Exception:
        return []


def _nvidia_platform() -> Platform | None:
    handles = _nvml_devices()
    if not handles:
        return None
    import pynvml

    name = pynvml.nvmlDeviceGetName(handles[0])
    if isinstance(name, bytes):
        name = name.decode()
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handles[0])
        capability: tuple[int, int] | None = (int(major), int(minor))
    except Exception:
        capability = None
    return Platform(
        kind="nvidia",
        device_name=str(name),
        compute_capability=capability,
        is_hopper_or_newer=capability is not None and capability >= _HOPPER,
        num_gpus=len(handles),
    )


def _amd_platform() -> Platform | None:
    # ROCm builds of torch answer through torch.cuda with torch.version.hip set. /dev/kfd is the ROCm
    # kernel driver: without it there is no AMD GPU, and importing torch (seconds) would be wasted.
    if not os.path.exists("/dev/kfd"):
        return None
    try:
        import torch
    except ImportError:
        return None
    if getattr(torch.version, "hip", None) is None:
        return None
    try:
        count = torch.cuda.device_count()
    except Exception:
        return None
    if count == 0:
        return None
    return Platform(
        kind="amd",
        device_name=torch.cuda.get_device_name(0),
        compute_capability=None,
        # MI300-class accelerators take the same "modern GPU" paths as Hopper in the seed's rules.
        is_hopper_or_newer=True,
        num_gpus=count,
    )


def _gpu_total_bytes(kind: PlatformKind) -> list[int]:
    if kind == "nvidia":
        import pynvml

        return [int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in _nvml_devices()]
    if kind == "amd":
        import torch

        return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    return []


CPU_PLATFORM = Platform(
    kind="cpu", device_name="cpu", compute_capability=None, is_hopper_or_newer=False, num_gpus=0
)


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    """The platform of this process (cached: the hardware does not change under a running process)."""
    return _nvidia_platform() or _amd_platform() or CPU_PLATFORM
