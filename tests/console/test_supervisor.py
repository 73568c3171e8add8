"""The supervisor with real processes: restarts, crash loops, stop escalation, re-adoption, down."""

from __future__ import annotations

import os
import select
import stat
import time

import httpx
import psutil

from tests.console.conftest import tokenspeed_running


def test_killed_server_is_back_after_backoff_with_exit_recorded(make_fleet):
    fleet = make_fleet(replicas=2)
    result = fleet.up()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "READY" in result.stdout
    before = fleet.servers()
    victim, other = fleet.server(0), fleet.server(1)
    old_pid = before[victim]["pid"]
    killed_at = time.time()
    psutil.Process(old_pid).kill()

    after = fleet.wait_for(
        lambda s: s[victim]["state"] == "READY" and s[victim]["pid"] != old_pid, what="the restart"
    )
    assert after[victim]["restarts"] == 1
    assert after[victim]["last_exit"]["signal"] == "SIGKILL"
    assert after[victim]["last_exit"]["code"] is None
    assert after[victim]["last_exit"]["at"] >= killed_at
    # Backoff: the new process started no sooner than initial_s after the exit.
    assert after[victim]["started_at"] - after[victim]["last_exit"]["at"] >= 0.45
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    # The other server was never touched.
    assert after[other]["pid"] == before[other]["pid"] and after[other]["restarts"] == 0
    assert httpx.get(after[victim]["url"] + "/health").status_code == 200
    # Both restarts are in the server's own log, next to its output.
    log = fleet.cli("logs", victim, "-n", "50").stdout
    assert "exited unexpectedly (signal SIGKILL)" in log and "restarting in" in log


def test_crash_loop_is_fatal_and_other_servers_keep_serving(make_fleet):
    fleet = make_fleet(replicas=2, max_restarts=2)
    bad, good = fleet.server(1), fleet.server(0)
    fleet.flag(bad, "crash")
    result = fleet.up()
    # `up` says which server failed and why, with its log, and exits 1 for scripts.
    assert result.returncode == 1
    assert f"{bad} is FATAL" in result.stderr and "crash loop" in result.stderr
    assert f"{bad} crashing" in result.stderr
    servers = fleet.wait_for(lambda s: s[good]["state"] == "READY", what="the good server")
    assert servers[bad]["state"] == "FATAL"
    assert servers[bad]["last_exit"]["code"] == 3
    assert servers[bad]["pid"] is None
    assert fleet.starts(bad) == 3  # the first start and max_restarts=2 restarts
    assert servers[good]["restarts"] == 0
    assert httpx.get(servers[good]["url"] + "/health").status_code == 200
    # An operator fixes the cause and starts it by hand: the crash-loop count starts over.
    fleet.flag(bad, "crash", on=False)
    assert fleet.cli("restart", bad).returncode == 0
    fleet.wait_for(lambda s: s[bad]["state"] == "READY", what="the repaired server")
    assert fleet.cli("status").returncode == 0


def test_stop_escalates_to_sigkill_after_stop_timeout(make_fleet):
    fleet = make_fleet(replicas=1, stop_timeout_s=1.5)
    name = fleet.server(0)
    fleet.flag(name, "ignore_term")
    assert fleet.up().returncode == 0
    from console.client import SupervisorClient

    with SupervisorClient(fleet.state_dir) as client:
        asked = time.time()
        assert client.stop(name)["state"] == "STOPPING"
        servers = fleet.wait_for(lambda s: s[name]["state"] == "STOPPED", what="the stop")
    assert time.time() - asked >= 1.4
    assert servers[name]["last_exit"]["signal"] == "SIGKILL"
    log = fleet.cli("logs", name).stdout
    assert "stopping: SIGTERM" in log and "did not stop within 1.5s: SIGKILL" in log
    # A stopped server stays stopped (no restart policy applies to an operator's stop).
    time.sleep(1.0)
    assert fleet.servers()[name]["state"] == "STOPPED"


def test_health_failures_mark_unhealthy_then_ready_again(make_fleet):
    fleet = make_fleet(replicas=1)
    name = fleet.server(0)
    assert fleet.up().returncode == 0
    pid = fleet.servers()[name]["pid"]
    fleet.flag(name, "unhealthy")
    servers = fleet.wait_for(lambda s: s[name]["state"] == "UNHEALTHY", what="UNHEALTHY")
    assert servers[name]["healthy"] is False and servers[name]["pid"] == pid
    assert fleet.cli("status").returncode == 1  # not all READY: scripts can tell
    fleet.flag(name, "unhealthy", on=False)
    servers = fleet.wait_for(lambda s: s[name]["state"] == "READY", what="READY again")
    assert servers[name]["pid"] == pid and servers[name]["restarts"] == 0


def test_supervisor_crash_then_up_readopts_running_servers(make_fleet):
    fleet = make_fleet(replicas=2)
    assert fleet.up().returncode == 0
    before = fleet.servers()
    supervisor = psutil.Process(fleet.supervisor_pid())
    supervisor.kill()
    supervisor.wait(5)
    # The servers outlive their supervisor and keep serving.
    for server in before.values():
        assert httpx.get(server["url"] + "/health").status_code == 200
    assert fleet.cli("status").returncode == 3  # nobody answers the control socket

    result = fleet.up()
    assert result.returncode == 0, result.stderr
    after = fleet.servers()
    for name, server in before.items():
        assert after[name]["pid"] == server["pid"], "re-adopted, not restarted"
        assert after[name]["state"] == "READY"
    assert fleet.supervisor_pid() != supervisor.pid
    assert "re-adopted by a new supervisor" in fleet.cli("logs", fleet.server(0)).stdout
    # The new supervisor really supervises them: a killed adopted server comes back.
    victim = fleet.server(0)
    psutil.Process(before[victim]["pid"]).kill()
    again = fleet.wait_for(
        lambda s: s[victim]["state"] == "READY" and s[victim]["pid"] != before[victim]["pid"], what="restart"
    )
    assert again[victim]["restarts"] == 1
    # Not our child any more: how it died is unknown, and says so.
    assert again[victim]["last_exit"] == {
        "code": None,
        "signal": None,
        "at": again[victim]["last_exit"]["at"],
        "reason": "exit status unknown (started by an earlier supervisor, so not this one's child)",
    }


def test_down_leaves_no_process_of_the_fleet(make_fleet):
    fleet = make_fleet(replicas=2)
    assert fleet.up().returncode == 0
    processes = fleet.processes()
    assert len(processes) >= 3  # supervisor + two servers
    sock = fleet.state_dir / "control.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(fleet.state_dir).st_mode) == 0o700

    result = fleet.cli("down")
    assert result.returncode == 0, result.stderr
    gone, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == []
    assert not sock.exists()
    assert fleet.cli("status").returncode == 3
    assert fleet.cli("down").returncode == 3  # nothing left to stop


def test_down_without_a_supervisor_still_stops_the_servers(make_fleet):
    fleet = make_fleet(replicas=1)
    assert fleet.up().returncode == 0
    processes = fleet.processes()
    psutil.Process(fleet.supervisor_pid()).kill()
    result = fleet.cli("down")
    assert result.returncode == 0, result.stderr
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == []


def test_operator_commands_rolling_restart_follow_logs_ps_and_probe(make_fleet):

    from console.client import SupervisorClient

    fleet = make_fleet(replicas=2)
    assert fleet.up().returncode == 0
    before = fleet.servers()
    ps = fleet.cli("ps")
    assert ps.returncode == 0 and "supervisor" in ps.stdout
    assert all(str(s["pid"]) in ps.stdout for s in before.values())

    with SupervisorClient(fleet.state_dir) as client:
        probe = client.probe()
        assert probe["probe"]["kind"] == "cpu" and probe["plan"]["fits"]
        assert [s["device"] for s in probe["plan"]["servers"]] == ["cpu", "cpu"]

    unknown = fleet.cli("restart", "nosuch")
    assert unknown.returncode == 2 and "no server named 'nosuch'" in unknown.stderr

    name = fleet.server(0)
    follow = tokenspeed_running("logs", name, "-f", "-n", "1", "--state-dir", str(fleet.state_dir))
    try:
        # Attached before the restart (its `-n 1` tail line is out), so no line of the restart can be missed.
        assert follow.stdout.readline(), "logs -f printed nothing"
        assert fleet.cli("restart", "--all", "--rolling").returncode == 0
        # One at a time: at no moment are both servers down.
        seen_down = set()
        deadline = time.monotonic() + 60
        while True:
            servers = fleet.servers()
            down = {n for n, s in servers.items() if s["state"] != "READY"}
            assert len(down) < 2, servers
            seen_down |= down
            if all(s["state"] == "READY" and s["pid"] != before[n]["pid"] for n, s in servers.items()):
                break
            assert time.monotonic() < deadline, servers
            time.sleep(0.05)
        assert all(s["restarts"] == 0 for s in servers.values())  # operator restarts are not failures
        lines = []
        deadline = time.monotonic() + 30
        while not any("stopping: SIGTERM" in line for line in lines):
            ready, _, _ = select.select([follow.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"logs -f showed no stop line within 30 s: {lines}"
            lines.append(follow.stdout.readline())
            assert lines[-1], "logs -f ended"
    finally:
        follow.kill()
        follow.wait()


def test_foreground_up_shows_states_and_ctrl_c_stops_the_fleet(make_fleet):
    import signal
    import subprocess

    fleet = make_fleet(replicas=1)
    up = tokenspeed_running(
        *("up", str(fleet.profile), "--state-dir", str(fleet.state_dir)),
        stderr=subprocess.STDOUT,
        # Started as a script's `trap '' INT` or a background job would start it: SIGINT ignored, which
        # exec inherits. Ctrl-C must still stop the fleet.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    lines = []
    while not lines or "Ctrl-C stops the fleet" not in lines[-1]:
        lines.append(up.stdout.readline())
        assert lines[-1], "".join(lines)
    # The state line shows the server (STARTING is printed only if a poll lands before it is READY).
    shown = "".join(lines)
    assert "t-0=" in shown and "t-0=READY" in shown, shown
    processes = fleet.processes()
    up.send_signal(signal.SIGINT)
    # `up` then runs `down`, which waits up to 60 s for the supervisor itself: wait longer than that, so
    # a slow stop ends in down's own report rather than in a timeout here.
    rest, _ = up.communicate(timeout=150)
    assert up.returncode == 0, rest
    assert "stopped" in rest
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == []


def test_sigterm_to_foreground_up_stops_the_fleet_as_ctrl_c_does(make_fleet):
    # A service manager stops `tokenspeed up` with SIGTERM: the fleet must not run on unwatched.
    import signal
    import subprocess

    fleet = make_fleet(replicas=1)
    up = tokenspeed_running(
        *("up", str(fleet.profile), "--state-dir", str(fleet.state_dir)), stderr=subprocess.STDOUT
    )
    lines = []
    while not lines or "Ctrl-C stops the fleet" not in lines[-1]:
        lines.append(up.stdout.readline())
        assert lines[-1], "".join(lines)
    processes = fleet.processes()  # the supervisor, the server and what they started
    up.send_signal(signal.SIGTERM)
    rest, _ = up.communicate(timeout=150)
    assert up.returncode == 0, rest
    assert "stopping the fleet" in rest and "stopped" in rest
    _, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == []
