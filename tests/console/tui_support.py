"""Real fleets for the console tests: a supervisor daemon running `metrics_endpoint.py` servers.

`running_fleet(...)` writes a profile, starts the supervisor the way `tokenspeed console PROFILE`
does, waits until every server is READY, and on exit shuts the fleet down and checks that no
process of it survived.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from console.client import SupervisorClient, SupervisorError
from console.tui.app import ConsoleApp
from console.tui.launch import start_supervisor
from console.tui.live_source import LiveSource

ENDPOINT = Path(__file__).with_name("metrics_endpoint.py")


@dataclass
class RunningFleet:
    name: str
    profile: Path
    state_dir: Path
    client: SupervisorClient

    def servers(self) -> list[dict]:
        return self.client.fleet()["servers"]

    def server(self, name: str) -> dict:
        return next(s for s in self.servers() if s["name"] == name)

    def wait(self, predicate, timeout: float = 20.0, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            with contextlib.suppress(SupervisorError):
                last = self.client.fleet()
                if predicate(last):
                    return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last fleet: {last}")

    def wait_ready(self, timeout: float = 20.0) -> dict:
        return self.wait(
            lambda f: all(s["state"] == "READY" and s["metrics"] for s in f["servers"]),
            timeout,
            "every server READY",
        )


def free_base_port(replicas: int, stride: int = 10) -> int:
    """A base port whose `replicas` ports (base + stride * i) are all free now."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + stride * replicas >= 65000:
            continue
        if all(_port_free(base + stride * i) for i in range(replicas)):
            return base
    raise RuntimeError("no free port range found")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def write_profile(directory: Path, name: str, replicas: int, base_port: int, extra_fleet: str = "") -> Path:
    path = directory / f"{name}.toml"
    path.write_text(
        f"""[server]
model = "tiny"
device = "cpu"

[fleet]
name = "{name}"
replicas = {replicas}
base_port = {base_port}
command = ["{sys.executable}", "{ENDPOINT}"]
restart = "always"
stop_timeout_s = 5.0
metrics_interval_s = 0.5
{extra_fleet}
[fleet.backoff]
initial_s = 0.2
max_s = 1.0

[fleet.health]
interval_s = 0.5
timeout_s = 1.0
failures = 2
"""
    )
    return path


def make_app(fleet, **kwargs) -> ConsoleApp:
    """A console on a running fleet (anything with its `state_dir`), polling every half second."""
    return ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5, **kwargs)


def shutdown(client: SupervisorClient, timeout: float = 20.0) -> None:
    """Ask the supervisor to stop its fleet and wait (up to `timeout`) until its socket no longer answers."""
    with contextlib.suppress(SupervisorError):
        client.shutdown()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and client.alive():
        time.sleep(0.1)
    client.close()


@contextlib.contextmanager
def running_fleet(name: str = "tui", replicas: int = 3, extra_fleet: str = "") -> Iterator[RunningFleet]:
    # A short directory: the control socket path must fit in sockaddr_un.
    root = Path(tempfile.mkdtemp(prefix="tsc-"))
    state_dir = root / "state"
    profile = write_profile(root, name, replicas, free_base_port(replicas), extra_fleet)
    start_supervisor(profile, state_dir, timeout=90)  # generous: CI machines can be busy
    fleet = RunningFleet(name, profile, state_dir, SupervisorClient(state_dir, timeout=3.0))
    pids: set[int] = set()
    try:
        fleet.wait_ready()
        yield fleet
    finally:
        with contextlib.suppress(Exception):
            pids = {p for s in fleet.servers() for p in s.get("pids") or [s.get("pid")] if p}
        shutdown(fleet.client)
        leftovers = [
            pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
        ]
        for pid in leftovers:  # never leave a process behind, even when a test failed
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        shutil.rmtree(root, ignore_errors=True)
        assert not leftovers, f"processes left after shutdown: {leftovers}"


def fleet_fixture(name: str, replicas: int = 3):
    """A module-scoped `fleet` fixture: one `running_fleet(name, replicas)` shared by the module's tests."""

    @pytest.fixture(scope="module")
    def fleet() -> Iterator[RunningFleet]:
        with running_fleet(name, replicas=replicas) as running:
            yield running

    return fleet
