"""The supervisor heals what hangs and loses no log line: real supervisors over real server processes.

A hung server (SIGSTOP) is restarted once it stays UNHEALTHY past `[supervisor]
unhealthy_restart_after_s`; a killed log pump is replaced and the lines the server wrote meanwhile
still reach its log; a server that ended while no supervisor watched it says so in `last_exit`.
"""

from __future__ import annotations

import os
import signal

import httpx
import psutil

from tests.console import conftest as console_fleets
from tests.console.profile_files import error_of, write
from tests.console.waiting import wait_until

make_fleet = console_fleets.make_fleet


def _with_supervisor_table(fleet, text: str) -> None:
    fleet.profile.write_text(fleet.profile.read_text() + "\n[supervisor]\n" + text + "\n")


def _log(fleet, name: str) -> str:
    return (fleet.state_dir / "logs" / f"{name}.log").read_text()


def _pumps(fleet, name: str) -> list[psutil.Process]:
    """The running log pumps of server `name` (one per server process; a pump started by a supervisor
    that died is no longer its child, so every process is looked at)."""
    log_path = str(fleet.state_dir / "logs" / f"{name}.log")
    found = []
    for proc in psutil.process_iter():
        try:
            cmdline = proc.cmdline()
            if "console.supervisor.logpump" in cmdline and log_path in cmdline:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _gone(proc: psutil.Process) -> bool:
    """Dead (a zombie counts: the pump's parent may be paused and not have reaped it yet)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_hung_server_is_restarted_with_reason_unhealthy(make_fleet):
    fleet = make_fleet(replicas=1, restart="on-failure")
    _with_supervisor_table(fleet, "unhealthy_restart_after_s = 1.5")
    name = fleet.server(0)
    assert fleet.up().returncode == 0
    hung = fleet.servers()[name]["pid"]
    os.kill(hung, signal.SIGSTOP)  # alive, port open, answers nothing: a hung server
    try:
        fleet.wait_for(lambda s: s[name]["state"] == "UNHEALTHY", timeout=20, what="UNHEALTHY")
        servers = fleet.wait_for(
            lambda s: s[name]["state"] == "READY" and s[name]["pid"] != hung, timeout=30, what="a restart"
        )
    finally:
        if psutil.pid_exists(hung):
            os.kill(hung, signal.SIGCONT)
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
    assert servers[name]["restarts"] == 1
    # Its own SIGTERM ended it (exit 0), yet "on-failure" restarted it: a hung server is a failure.
    assert servers[name]["last_exit"]["reason"] == "unhealthy"
    log = _log(fleet, name)
    assert "(unhealthy_restart_after_s=1.5): restarting, reason unhealthy" in log
    assert "stopped (exit code 0: unhealthy)" in log
    assert fleet.starts(name) == 2


def test_unhealthy_restart_setting_is_checked(tmp_path):
    base = '[server]\nmodel = "demo"\ndevice = "cpu"\n[supervisor]\n'
    typo = error_of(write(tmp_path, base + "unhealthy_restart_after = 5\n"))
    assert "[supervisor] key" in str(typo) and "did you mean 'unhealthy_restart_after_s'" in str(typo)
    negative = error_of(write(tmp_path, base + "unhealthy_restart_after_s = -1\n"))
    assert "unhealthy_restart_after_s" in str(negative) and "must be >= 0" in str(negative)


def test_killed_log_pump_is_restarted_and_keeps_the_lines_written_meanwhile(make_fleet):
    fleet = make_fleet(replicas=1)
    name = fleet.server(0)
    assert fleet.up().returncode == 0
    url = fleet.servers()[name]["url"]
    (pump,) = _pumps(fleet, name)
    supervisor = psutil.Process(fleet.supervisor_pid())
    # With the supervisor paused, nothing can replace the pump before the lines below are written.
    supervisor.suspend()
    try:
        pump.kill()
        wait_until(lambda: _gone(pump), 5, "the pump to die")
        for i in range(30):
            assert httpx.get(f"{url}/say?while-no-pump-{i}", timeout=5).status_code == 200
    finally:
        supervisor.resume()
    (again,) = wait_until(lambda: _pumps(fleet, name), 10, "a new log pump")
    assert again.pid != pump.pid
    for i in range(30):
        assert httpx.get(f"{url}/say?after-{i}", timeout=5).status_code == 200
    wait_until(lambda: "after-29" in _log(fleet, name), 10, "the last line in the log")
    lines = _log(fleet, name).splitlines()
    expected = [f"while-no-pump-{i}" for i in range(30)] + [f"after-{i}" for i in range(30)]
    assert [line for line in lines if line in expected] == expected
    assert "log pump ended (signal SIGKILL): restarted" in "\n".join(lines)


def test_after_a_supervisor_crash_exits_say_what_is_known_and_pumps_are_still_kept(make_fleet):
    fleet = make_fleet(replicas=2)
    dead, kept = fleet.server(0), fleet.server(1)
    assert fleet.up().returncode == 0
    before = fleet.servers()
    supervisor = psutil.Process(fleet.supervisor_pid())
    supervisor.kill()
    supervisor.wait(5)
    server = psutil.Process(before[dead]["pid"])
    server.kill()  # ends while no supervisor watches: its exit status goes to init
    server.wait(5)

    assert fleet.up().returncode == 0
    after = fleet.servers()
    assert after[dead]["pid"] != before[dead]["pid"] and after[dead]["state"] == "READY"
    assert after[dead]["last_exit"]["reason"] == "exited while unsupervised; status unknown"
    assert after[dead]["last_exit"]["code"] is None and after[dead]["last_exit"]["signal"] is None
    assert "not re-adopted: exited while unsupervised; status unknown" in _log(fleet, dead)
    assert "exited while unsupervised" in fleet.cli("status").stdout

    # The re-adopted server's pump is watched by the new supervisor too, on the same pipe.
    assert after[kept]["pid"] == before[kept]["pid"]
    (pump,) = _pumps(fleet, kept)
    pump.kill()
    wait_until(lambda: _gone(pump), 5, "the pump to die")
    for i in range(10):
        assert httpx.get(f"{after[kept]['url']}/say?adopted-{i}", timeout=5).status_code == 200
    wait_until(lambda: "adopted-9" in _log(fleet, kept), 10, "the adopted server's lines in its log")
    assert "log pump ended" in _log(fleet, kept)
