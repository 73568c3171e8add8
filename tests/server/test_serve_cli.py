"""`tokenspeed serve --print-config` and start-up errors that must stop before any process starts."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys

import psutil
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
    assert "started 1 child" not in r.stderr  # refused before any process starts


def test_a_port_in_use_fails_before_any_process_starts(tiny_model):
    # The schedulers are spawned as soon as the front end's checks pass: the port is one of those checks.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _serve(tiny_model, "--device", "cpu", "--port", str(port))
    assert r.returncode == 2, r.stderr
    assert f"--port {port} on 127.0.0.1 is not available" in r.stderr and "choose another --port" in r.stderr
    assert "started 1 child" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_front_end_failure_after_the_spawn_leaves_no_scheduler_behind(tiny_model, tmp_path):
    """The tokenizer loads while the schedulers start; one that cannot load fails the server with its
    reason, and the scheduler already spawned goes with it."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    r = _serve(str(model), "--device", "cpu", "--port", str(free_port()), timeout=240)
    assert r.returncode == 2, r.stderr
    # The front end's own error line names the problem (the scheduler, loading the same tokenizer for its
    # grammar backend, may get there first and say the same).
    assert re.search(rf"\[main\] ERROR tokenspeed.serve: cannot load a tokenizer from '{re.escape(str(model))}': "
                     r"KeyError: 'added_tokens'\. Pass a local folder", r.stderr), r.stderr  # fmt: skip
    spawned = re.search(r"started 1 child process\(es\): \{'scheduler dp0 tp0': (\d+)\}", r.stderr)
    assert spawned, r.stderr  # the scheduler started before the tokenizer was loaded
    assert not _spawned_child_alive(int(spawned.group(1)))


def _spawned_child_alive(pid: int) -> bool:
    try:
        child = psutil.Process(pid)
        return child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline())
    except psutil.NoSuchProcess:
        return False


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
