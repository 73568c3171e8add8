"""Fixtures for fleet tests: real supervisors over real processes, on free ports, cleaned up always."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
FAKE_SERVER = HERE / "supervised_http.py"


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(count: int, stride: int = 10) -> int:
    """A base port whose `count` replicas (and the ports they derive) are free right now."""
    for _ in range(200):
        base = random.randrange(20000, 28000, 10)
        if all(port_free(base + stride * i + d) for i in range(count) for d in (0, 1, 2)):
            return base
    raise RuntimeError("no free port block")


def tokenspeed(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def tokenspeed_running(*args: str, **popen) -> subprocess.Popen:
    """`tokenspeed ARGS` left running (a log follower, a foreground `up`), its stdout a text pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "tokenspeed", *args], stdout=subprocess.PIPE, text=True, **popen
    )


@dataclass
class Fleet:
    root: Path
    profile: Path
    state_dir: Path
    control: Path
    name: str
    base_port: int
    replicas: int
    model: str = "fake-model"  # what its profile's [server] model names

    def server(self, i: int) -> str:
        return f"{self.name}-{i}"

    def up(self, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return tokenspeed(
            "up", "-d", str(self.profile), "--state-dir", str(self.state_dir), *extra, timeout=timeout
        )

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return tokenspeed(*args, "--state-dir", str(self.state_dir), timeout=timeout)

    def status(self) -> dict:
        result = self.cli("status", "--json")
        assert result.returncode in (0, 1), result.stderr
        return json.loads(result.stdout)

    def servers(self) -> dict[str, dict]:
        """Servers by name, asked in-process over the control socket (the CLI is tested on its own)."""
        from console.client import SupervisorClient

        with SupervisorClient(self.state_dir) as client:
            return {s["name"]: s for s in client.fleet()["servers"]}

    def wait_for(self, predicate, timeout: float = 30, what: str = "condition") -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            servers = self.servers()
            if predicate(servers):
                return servers
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {json.dumps(servers, indent=1)}")
            time.sleep(0.2)

    def supervisor_pid(self) -> int | None:
        try:
            return json.loads((self.state_dir / "supervisor.pid").read_text())["pid"]
        except (OSError, ValueError):
            return None

    def flag(self, server: str, kind: str, on: bool = True) -> None:
        path = self.control / f"{server}.{kind}"
        if on:
            path.touch()
        elif path.exists():
            path.unlink()

    def starts(self, server: str) -> int:
        path = self.control / f"{server}.starts"
        return len(path.read_text().split()) if path.exists() else 0

    def processes(self) -> list[psutil.Process]:
        """The supervisor, every server process and everything they started (as psutil handles, which
        refuse to signal a reused pid)."""
        found: list[psutil.Process] = []
        records = []
        try:
            records.append(json.loads((self.state_dir / "supervisor.pid").read_text()))
        except (OSError, ValueError):
            pass
        state_file = self.state_dir / "state.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        records += [p for s in state.get("servers", []) for p in s.get("processes", [])]
        for record in records:
            try:
                proc = psutil.Process(record["pid"])
                if abs(proc.create_time() - record["create_time"]) > 0.05:
                    continue
                found.append(proc)
                found.extend(proc.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return found


def write_profile(
    path: Path,
    name: str,
    base_port: int,
    control: Path,
    replicas: int = 2,
    server: str = "",
    model: str = "fake-model",
    **fleet,
) -> None:
    settings = {
        "name": name,
        "replicas": replicas,
        "base_port": base_port,
        "command": [sys.executable, str(FAKE_SERVER)],
        "restart": "always",
        "max_restarts": 3,
        "restart_window_s": 60,
        "stop_timeout_s": 2,
        "metrics_interval_s": 0.5,
        **fleet,
    }
    # command = None: the real `tokenspeed serve`.
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items() if v is not None]
    path.write_text(
        textwrap.dedent(
            """\
            [server]
            model = "{model}"
            device = "cpu"
            {server}

            [fleet]
            {fleet}

            [fleet.backoff]
            initial_s = 0.5
            max_s = 2
            reset_after_s = 30

            [fleet.health]
            interval_s = 0.3
            timeout_s = 1
            failures = 2

            [env]
            FAKE_CONTROL_DIR = "{control}"
            """
        ).format(fleet="\n".join(lines), control=control, server=server, model=model)
    )


def _kill_all(fleet: Fleet) -> None:
    for proc in fleet.processes():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture
def make_fleet(tmp_path):
    made: list[Fleet] = []

    def make(
        replicas: int = 2, name: str = "t", server: str = "", model: str = "fake-model", **fleet_settings
    ) -> Fleet:
        root = tmp_path / f"f{len(made)}"
        control = root / "ctl"
        control.mkdir(parents=True)
        base = free_base_port(replicas)
        profile = root / "fleet.toml"
        write_profile(profile, name, base, control, replicas, server, model, **fleet_settings)
        fleet = Fleet(root, profile, root / "state", control, name, base, replicas, model)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        if fleet.state_dir.exists():
            tokenspeed("down", "--state-dir", str(fleet.state_dir), "--timeout", "10")
            _kill_all(fleet)


@pytest.fixture
def make_tiny_fleet(make_fleet, tmp_path):
    """A one-server fleet of the real `tokenspeed serve` over a tiny random llama: restarted on failure, given
    five minutes to start (imports and warm-up on a shared CPU) and 30 s to stop unless told otherwise."""

    def make(name: str, server: str, **fleet_settings) -> Fleet:
        from tests.tiny_models import make_tiny_model

        settings = {"restart": "on-failure", "startup_timeout_s": 300, "stop_timeout_s": 30, **fleet_settings}
        model = make_tiny_model("llama", tmp_path / "models")
        return make_fleet(replicas=1, name=name, model=model, server=server, command=None, **settings)

    return make
