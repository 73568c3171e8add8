"""`tokenspeed down` leaves no process of the fleet on the machine: not the supervisor, not a server, not
a process a server started, not a log pump; also when the supervisor was killed before `down`.

The check scans the whole process table, not only the pids the supervisor recorded: a process that
escaped the recorded tree (reparented to init) would be found by what it carries, the fleet's
control directory in its environment or the state directory on its command line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

BUSY = Path(__file__).with_name("busy_http.py")


def fleet_processes(fleet) -> list[psutil.Process]:
    """Every live process that belongs to the fleet, found by scanning all processes."""
    mine = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            in_cmdline = any(str(fleet.state_dir) in arg for arg in proc.cmdline())
            in_env = proc.environ().get("FAKE_CONTROL_DIR") == str(fleet.control)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if in_cmdline or in_env:
            mine.append(proc)
    return mine


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{proc.pid}: (gone)")
    return out


def wait_until_none_left(fleet, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while left := fleet_processes(fleet):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of the fleet still running after down: {describe(left)}")
        time.sleep(0.2)


def start(fleet) -> list[psutil.Process]:
    result = fleet.up()
    assert result.returncode == 0, result.stdout + result.stderr
    servers = fleet.servers()
    # Wait until each server's child (a stand-in for its scheduler ranks) is up too.
    deadline = time.monotonic() + 30
    while True:
        found = fleet_processes(fleet)
        children = [c for s in servers.values() for c in psutil.Process(s["pid"]).children()]
        if len(children) == len(servers):
            break
        assert time.monotonic() < deadline, describe(found)
        time.sleep(0.2)
    pids = {p.pid for p in found}
    assert fleet.supervisor_pid() in pids
    assert {s["pid"] for s in servers.values()} <= pids and {c.pid for c in children} <= pids
    pumps = [p for p in found if "console.supervisor.logpump" in p.cmdline()]
    assert len(pumps) == len(servers), describe(found)
    return found


def test_down_leaves_no_process_of_the_fleet_on_the_machine(make_fleet):
    fleet = make_fleet(replicas=2, command=[sys.executable, str(BUSY), "--child", "--log-lines-per-s", "50"])
    assert len(start(fleet)) == 7  # supervisor, 2 servers, their 2 children, 2 log pumps
    result = fleet.cli("down")
    assert result.returncode == 0, result.stdout + result.stderr
    wait_until_none_left(fleet)
    assert fleet.cli("status").returncode == 3


def test_down_after_the_supervisor_was_killed_leaves_no_process(make_fleet):
    fleet = make_fleet(replicas=2, command=[sys.executable, str(BUSY), "--child", "--log-lines-per-s", "50"])
    start(fleet)
    supervisor = psutil.Process(fleet.supervisor_pid())
    supervisor.kill()
    supervisor.wait(10)
    result = fleet.cli("down")
    assert result.returncode == 0, result.stdout + result.stderr
    wait_until_none_left(fleet)
