"""What hardware this process runs on: NVIDIA, AMD or CPU only.

`current_platform()` answers once per process (NVML initialisation is not free and the answer
cannot change while the process lives); the cache sits on the function, not in a module global.
Machines without a GPU, or without the NVML library or NVIDIA driver, report `cpu` without raising or
warning. Any other NVML failure (a driver that answers with an error, a device it cannot read) also
reports `cpu`, since nothing here can use the GPU, but says so: a warning in the log and
`Platform.nvml_error`, so a GPU machine that looks like a CPU machine is explained.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass
from typing import Literal

PlatformKind = Literal["nvidia", "amd", "cpu"]

# Hopper is compute capability 9.0; everything newer (Blackwell 10.x, 12.x) counts as "Hopper or newer".
_HOPPER = (9, 0)
_BYTES_PER_GIB = 1024**3
# What NVML raises on a machine that simply has no NVIDIA GPU: not worth a warning.
_NO_NVIDIA_GPU = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NotFound")

logger = logging.getLogger(__name__)


class KindChecks:
    """`is_nvidia` / `is_amd` / `is_cpu` for any class with a `kind` (the probed `Platform` and the facts
    `config.resolve` keeps of it), so the spelling of each kind is written once."""

    kind: PlatformKind

    @property
    def is_nvidia(self) -> bool:
        return self.kind == "nvidia"

    @property
    def is_amd(self) -> bool:
        return self.kind == "amd"

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"


@dataclass(frozen=True)
class Platform(KindChecks):
    kind: PlatformKind
    device_name: str
    compute_capability: tuple[int, int] | None
    is_hopper_or_newer: bool
    num_gpus: int
    # Set when NVML failed for another reason than "no NVIDIA GPU here" (the platform is then `cpu`).
    nvml_error: str | None = None

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


def _nvml_devices() -> tuple[list, str | None]:
    """NVML handles of the visible GPUs, and why there are none when NVML failed unexpectedly.

    Empty without an error where NVML is missing or finds no driver (a CPU machine).
    """
    try:
        import pynvml
    except ImportError:
        return [], None
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in _visible_indices(count)], None
    except Exception as exc:
        if type(exc).__name__ in _NO_NVIDIA_GPU:
            return [], None
        return [], f"{type(exc).__name__}: {exc}"


def _nvidia_platform() -> Platform | str | None:
    """The NVIDIA platform; None without NVIDIA GPUs; the NVML error text when NVML failed unexpectedly."""
    handles, error = _nvml_devices()
    if error is not None:
        return error
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

        return [int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in _nvml_devices()[0]]
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
    nvidia = _nvidia_platform()
    if isinstance(nvidia, Platform):
        return nvidia
    found = _amd_platform()
    if found is not None:
        return found
    if nvidia is not None:
        logger.warning(
            "NVML failed (%s): no NVIDIA GPU can be used, this process runs as on a CPU machine; check the "
            "driver with nvidia-smi",
            nvidia,
        )
        return dataclasses.replace(CPU_PLATFORM, nvml_error=nvidia)
    return CPU_PLATFORM
