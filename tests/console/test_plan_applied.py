"""The supervisor applies the plan and knows its own GPU memory, against GPU readings given to the probe
through TOKENSPEED_GPU_READINGS (rewritten as the test goes, as NVML would report them).

Real supervisors over the fake server of tests/console/supervised_http.py (it records its command line
and, like `tokenspeed serve`, starts a child process): a planned GPU server gets the plan's flags; the GPU
view names its child's memory as the fleet's own, another fleet's server as that fleet's, and the rest as
unknown; a running fleet's plan fits as running; a restart after another job took memory is re-planned
(and logged), and one that no longer fits is refused with the reason instead of started.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import textwrap
import time
from pathlib import Path

from console.client import SupervisorClient
from console.tui.screens.gpus import owners_text
from console.tui.screens.server import planned_vs_running
from tests.console.conftest import FAKE_SERVER, free_base_port, tokenspeed

DATA = Path(__file__).resolve().parent / "data"
SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"  # the models' config.json files
IDLE = json.loads((DATA / "h200x8-idle.json").read_text())
GPU0 = IDLE["gpus"][0]  # 143771 MiB total, 143194 MiB free when idle


def _readings(path: Path, processes: list[tuple[int, float]]) -> None:
    """One H200 whose free memory is what `processes` (pid, MiB) leave of the idle reading."""
    gpu = copy.deepcopy(GPU0)
    used = sum(mib for _, mib in processes)
    gpu.update(
        free_mib=GPU0["free_mib"] - used,
        used_by_others_mib=used,
        processes=[{"pid": pid, "used_mib": mib} for pid, mib in processes],
    )
    path.write_text(json.dumps({**IDLE, "gpus": [gpu]}))


def _profile(root: Path, name: str, device: str, server: str = "") -> Path:
    control = root / name
    control.mkdir(parents=True)
    path = root / f"{name}.toml"
    path.write_text(
        textwrap.dedent(f"""\
            [server]
            model = "{root / "model"}"
            device = "{device}"
            {server}
            [fleet]
            name = "{name}"
            base_port = {free_base_port(1)}
            gpus = [0]
            command = {json.dumps([sys.executable, str(FAKE_SERVER)])}
            restart = "on-failure"
            stop_timeout_s = 2
            [fleet.health]
            interval_s = 0.3
            [env]
            FAKE_CONTROL_DIR = "{control}"
            FAKE_CHILD = "1"
            """)
    )
    return path


def _wait(client: SupervisorClient, name: str, predicate, what: str, timeout: float = 40) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        server = next(s for s in client.fleet()["servers"] if s["name"] == name)
        if predicate(server):
            return server
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {server}"
        time.sleep(0.2)


def _argv(root: Path, name: str) -> list[list[str]]:
    return [json.loads(line) for line in (root / name / f"{name}-0.argv").read_text().splitlines()]


def test_plan_applied_attributed_and_replanned(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text((SHAPES / "llama-3.1-8b.json").read_text())
    readings = tmp_path / "readings.json"
    _readings(readings, [])
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg"), "TOKENSPEED_GPU_READINGS": str(readings)}
    gpu = _profile(tmp_path, "gp", "cuda", "max_model_len = 8192")
    other = _profile(tmp_path, "other", "cpu")
    states = tmp_path / "xdg" / "tokenspeed"
    try:
        for profile in (gpu, other):
            result = tokenspeed("up", "-d", str(profile), env=env, timeout=90)
            assert result.returncode == 0, result.stderr
        planned = json.loads(tokenspeed("profile", "plan", str(gpu), "--json", env=env).stdout)["servers"][0]
        assert planned["planned_flags"][:2] == ["--gpu-memory-utilization", "0.88"]
        assert "--cudagraph-capture-sizes" in planned["planned_flags"]
        # The server's command line ends with the plan's flags; the CPU fleet's gets none.
        assert _argv(tmp_path, "gp")[0][-len(planned["planned_flags"]) :] == planned["planned_flags"]
        assert "--gpu-memory-utilization" not in _argv(tmp_path, "other")[0]

        with SupervisorClient(states / "gp") as client, SupervisorClient(states / "other") as other_client:
            server = _wait(client, "gp-0", lambda s: s["state"] == "READY", "gp-0 READY")
            assert server["plan"]["kv_tokens"] == planned["kv_tokens"]
            child = int((tmp_path / "gp" / "gp-0.child").read_text())
            other_pid = other_client.fleet()["servers"][0]["pid"]
            # The fleet's server (through its child) holds 120 GiB, the other fleet's 2 GiB, this test 1 GiB:
            # 16.8 GiB are free, too little for the server were its own memory not its own.
            _readings(readings, [(child, 122880.0), (other_pid, 2048.0), (os.getpid(), 1024.0)])
            view = client.probe()
            (owners,) = view["owners"]
            assert owners["own"] == {"gp-0": 122880.0}
            assert owners["other_fleets"] == {"other/other-0": 2048.0}
            assert owners["unknown"] == {str(os.getpid()): 1024.0}
            # The GPU screen's words for it.
            shown = owners_text(view["owners"], view["probe"]["gpus"]).plain
            assert "GPU 0: this fleet: gp-0 120.0 GiB; other fleets: other/other-0 2.0 GiB" in shown
            assert f"unknown others: pid {os.getpid()} 1.0 GiB" in shown
            # The Server screen's: what was planned, what the server runs with.
            planned_text = planned_vs_running(server["plan"], client.info("gp-0"))
            assert "gpu_memory_utilization: planned 0.88, running 0.88" in planned_text
            assert "CUDA graphs: planned 23 sizes up to 160, running 23 sizes up to 160" in planned_text
            # Its own 120 GiB count as free: the plan fits as running, with 3 GiB less than when idle; so
            # says `tokenspeed profile plan` on this machine.
            assert view["plan"]["verdict"] == "fits as running"
            cli_plan = json.loads(tokenspeed("profile", "plan", str(gpu), "--json", env=env).stdout)
            assert cli_plan["verdict"] == "fits as running"
            assert cli_plan["servers"][0]["kv_tokens"] == view["plan"]["servers"][0]["kv_tokens"]
            running = view["plan"]["servers"][0]
            per_token = running["kv_bytes_per_token"]
            # (whole 64-token pages)
            assert abs(planned["kv_tokens"] - running["kv_tokens"] - 3072 * 2**20 / per_token) <= 64

            # Another job takes 60 GiB; the server restarts (the readings as they are once it stopped).
            starts = len(_argv(tmp_path, "gp"))
            _readings(readings, [(other_pid, 2048.0), (999999, 61440.0)])
            tokenspeed("restart", "gp-0", "--state-dir", str(states / "gp"))
            server = _wait(
                client,
                "gp-0",
                lambda s: s["state"] == "READY" and len(_argv(tmp_path, "gp")) > starts,
                "restart",
            )
            assert server["plan"]["kv_tokens"] < planned["kv_tokens"]
            log = (states / "gp" / "logs" / "gp-0.log").read_text()
            assert f"KV tokens {planned['kv_tokens']} -> {server['plan']['kv_tokens']}" in log

            # Now the other job takes nearly all of it: the restart is refused, nothing is started.
            starts = len(_argv(tmp_path, "gp"))
            _readings(readings, [(999999, 138000.0)])
            tokenspeed("restart", "gp-0", "--state-dir", str(states / "gp"))
            server = _wait(client, "gp-0", lambda s: s["state"] == "FATAL", "gp-0 refused", timeout=30)
            assert "refused: the plan does not fit the GPUs now" in server["error"]
            assert "less than one sequence" in server["error"] or "exceed" in server["error"]
            assert len(_argv(tmp_path, "gp")) == starts
            assert "refused: the plan does not fit" in (states / "gp" / "logs" / "gp-0.log").read_text()
    finally:
        for name in ("gp", "other"):
            tokenspeed("down", "--state-dir", str(states / name), "--timeout", "20", env=env)
