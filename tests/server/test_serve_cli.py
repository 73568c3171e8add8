"""`tokenspeed serve --print-config` and start-up errors that must stop before any process starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.server.server_proc import free_port


def _serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", "serve", *args], capture_output=True, text=True, timeout=timeout
    )


def test_print_config_shows_resolved_args_and_mapping(tiny_model):
    r = _serve(tiny_model, "--device", "cpu", "--data-parallel-size", "2", "--print-config")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["server_args"]["model"] == tiny_model
    assert cfg["server_args"]["device"] == "cpu"
    assert cfg["mapping"]["world_size"] == 2 and cfg["mapping"]["attn_dp_size"] == 2
    assert len(cfg["mapping"]["ranks"]) == 2


def test_unknown_warmup_fails_fast_with_the_names(tiny_model):
    r = _serve(tiny_model, "--device", "cpu", "--warmups", "nope", "--port", str(free_port()))
    assert r.returncode == 2
    assert "--warmups: unknown warm-up 'nope'" in r.stderr and "batch" in r.stderr


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has a CUDA GPU: the default device is there"
)
def test_cuda_default_without_a_gpu_fails_fast_and_names_device_cpu(tiny_model):
    r = _serve(tiny_model, "--port", str(free_port()), timeout=60)
    assert r.returncode == 2
    assert "--device cuda (the default) needs an NVIDIA GPU" in r.stderr and "--device cpu" in r.stderr
    assert "Traceback" not in r.stderr and "started 1 child" not in r.stderr
    # Checking a GPU configuration from a machine without one still works.
    assert _serve(tiny_model, "--print-config").returncode == 0
