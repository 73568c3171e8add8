"""current_platform(): what a machine reports, including the machines with no GPU or no NVML."""

import sys
import warnings

import pytest

from tokenspeed import platform as platform_mod
from tokenspeed.platform import CPU_PLATFORM, Platform, current_platform


def _fresh():
    current_platform.cache_clear()
    return current_platform()


def _has_nvidia_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


@pytest.fixture(autouse=True)
def _clear_cache():
    current_platform.cache_clear()
    yield
    current_platform.cache_clear()


def test_platform_is_frozen_and_cached():
    p = current_platform()
    assert current_platform() is p
    with pytest.raises(AttributeError):
        p.kind = "amd"  # type: ignore[misc]


@pytest.mark.skipif(_has_nvidia_gpu(), reason="this machine has an NVIDIA GPU")
def test_machine_without_gpu_reports_cpu_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = _fresh()
    assert p == CPU_PLATFORM
    assert (p.kind, p.num_gpus, p.is_hopper_or_newer, p.compute_capability) == ("cpu", 0, False, None)
    assert p.is_cpu and not p.is_nvidia and not p.is_amd
    assert p.gpu_memory_capacity_gb() is None


def test_missing_nvml_library_reports_cpu(monkeypatch, capsys):
    # `import pynvml` raising ImportError is what a machine without nvidia-ml-py sees.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(platform_mod.os.path, "exists", lambda path: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = _fresh()
    assert p.kind == "cpu"
    assert p.gpu_memory_capacity_gb() is None
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


@pytest.mark.parametrize(
    ("visible", "count", "expected"),
    [(None, 4, [0, 1, 2, 3]), ("1,3", 4, [1, 3]), ("", 4, []), ("0,7", 2, [0]), ("GPU-abc", 2, [0, 1])],
)
def test_cuda_visible_devices_selects_nvml_indices(monkeypatch, visible, count, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert platform_mod._visible_indices(count) == expected


def test_hopper_flag_follows_compute_capability():
    hopper = Platform("nvidia", "NVIDIA H200", (9, 0), True, 8)
    assert hopper.is_hopper_plus and hopper.is_nvidia


@pytest.mark.gpu
def test_nvidia_gpu_reported_through_nvml():
    import pynvml

    p = _fresh()
    assert p.kind == "nvidia"
    assert p.num_gpus >= 1
    assert p.compute_capability is not None
    assert p.is_hopper_or_newer == (p.compute_capability >= (9, 0))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(platform_mod._visible_indices(pynvml.nvmlDeviceGetCount())[0])
    name = pynvml.nvmlDeviceGetName(handle)
    assert p.device_name == (name.decode() if isinstance(name, bytes) else name)
    gb = p.gpu_memory_capacity_gb()
    assert gb is not None and 1 < gb < 1024
