"""Per-process GPU memory and SM utilisation, parsed from NVML's own return types (pynvml's structs, built
here as the driver fills them), and what a machine without a GPU reports: nothing, so the Server screen
draws "-"."""

from __future__ import annotations

import pynvml

from console.supervisor.gpu_processes import (
    GpuProcessUsage,
    memory_by_pid,
    merge_devices,
    read_gpu_processes,
    sm_by_pid,
)
from console.tui.screens.server import processes_text

GIB = 1024**3


def running(pid: int, used: int) -> object:
    """One entry of nvmlDeviceGetComputeRunningProcesses: pynvml's friendly object of the v3 struct, with
    usedGpuMemory set to None where the driver reports NVML_VALUE_NOT_AVAILABLE (as pynvml does)."""
    entry = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(pid=pid, usedGpuMemory=used))
    if entry.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
        entry.usedGpuMemory = None
    return entry


def utilisation(*samples: tuple[int, int, int]) -> list:
    """nvmlDeviceGetProcessUtilization's answer: a slice of a c_nvmlProcessUtilizationSample_t array."""
    array = (pynvml.c_nvmlProcessUtilizationSample_t * len(samples))()
    for slot, (pid, stamp, sm) in zip(array, samples, strict=True):
        slot.pid, slot.timeStamp, slot.smUtil, slot.memUtil = pid, stamp, sm, sm // 2
    return array[0 : len(samples)]


def test_memory_per_process_in_mib_and_none_where_nvml_has_no_figure():
    listed = [running(101, 3 * GIB), running(102, pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)]
    assert memory_by_pid(listed) == {101: 3072.0, 102: None}


def test_sm_share_is_each_process_newest_sample_and_not_available_is_left_out():
    samples = utilisation(
        (101, 1_000, 35), (101, 3_000, 80), (101, 2_000, 10),  # the newest (stamp 3000) counts
        (102, 3_000, 0xFFFFFFFF),  # NVML_VALUE_NOT_AVAILABLE for an unsigned int
        (103, 2_500, 0),
    )  # fmt: skip
    assert sm_by_pid(samples) == {101: 80.0, 103: 0.0}


def test_a_process_on_two_gpus_adds_its_memory_and_shows_its_busiest_gpu():
    gpu0 = (memory_by_pid([running(101, GIB), running(102, 2 * GIB)]), sm_by_pid(utilisation((101, 5, 90))))
    gpu1 = (memory_by_pid([running(101, GIB)]), sm_by_pid(utilisation((101, 5, 40), (104, 5, 7))))
    assert merge_devices([gpu0, gpu1]) == {
        101: GpuProcessUsage(2048.0, 90.0),
        102: GpuProcessUsage(2048.0, None),
        104: GpuProcessUsage(None, 7.0),  # sampled, but not in the compute list (a graphics context)
    }


def test_without_a_gpu_nothing_is_reported_and_the_columns_read_dash(monkeypatch):
    monkeypatch.delenv("TOKENSPEED_GPU_READINGS", raising=False)
    assert read_gpu_processes() == {}  # this machine has no NVIDIA driver (CI: CPU only)
    shown = processes_text(
        ({"pid": 4242, "name": "front end", "cpu_percent": 12.0, "rss_mib": 300.0,
          "gpu_mib": None, "gpu_sm_percent": None},
         {"pid": 4243, "name": "scheduler / controller", "cpu_percent": 97.0, "rss_mib": 2048.0,
          "gpu_mib": 40_960.0, "gpu_sm_percent": 83.0})
    ).plain.splitlines()  # fmt: skip
    assert [" ".join(line.split()) for line in shown] == [
        "PID CPU RSS GPU MEM SM ROLE",
        "4242 12% 300 MiB - - front end",
        "4243 97% 2.0 GiB 40.0 GiB 83% scheduler / controller",
    ]
