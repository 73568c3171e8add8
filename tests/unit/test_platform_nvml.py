"""An NVML failure is a CPU machine only when it means "no NVIDIA GPU"; any other failure is logged and
kept on the platform, so a GPU machine that looks like a CPU machine is explained."""

import logging
import sys
import types

import pytest

from tokenspeed import platform


def _fake_nvml(error_name: str) -> types.ModuleType:
    error = type(error_name, (Exception,), {})

    def init():
        raise error("from the fake NVML")

    return types.SimpleNamespace(nvmlInit=init)


@pytest.fixture
def fresh_platform(monkeypatch):
    platform.current_platform.cache_clear()
    monkeypatch.setattr(platform, "_amd_platform", lambda: None)
    yield
    platform.current_platform.cache_clear()


def test_no_driver_is_a_quiet_cpu_machine(monkeypatch, caplog, fresh_platform):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml("NVMLError_DriverNotLoaded"))
    with caplog.at_level(logging.WARNING, logger="tokenspeed.platform"):
        found = platform.current_platform()
    assert found.is_cpu and found.nvml_error is None
    assert not caplog.records


def test_other_nvml_failure_is_logged_and_kept(monkeypatch, caplog, fresh_platform):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml("NVMLError_Unknown"))
    with caplog.at_level(logging.WARNING, logger="tokenspeed.platform"):
        found = platform.current_platform()
    assert found.is_cpu
    assert found.nvml_error == "NVMLError_Unknown: from the fake NVML"
    assert any("NVML failed (NVMLError_Unknown" in r.getMessage() for r in caplog.records)
