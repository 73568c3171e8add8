"""The fleet pre-flight, through the real CLI: a wrong model, a typo, taken ports, a state directory in use
are all reported at once by `profile validate`, `profile plan` and `up` (each naming its profile key and the
fix), before anything starts; a start that fails anyway says why in `status`, not "exit status unknown"."""

from __future__ import annotations

import socket
import time

from console.client import SupervisorClient
from tests.console.conftest import free_base_port, tokenspeed

DEMO_TYPOS = """\
[server]
device = "cpu"
max_num_seq = 4

[groups.dense]
model = "demoo"

[groups.moe]
model = "demo-moe"

[fleet]
name = "pf-typos"
base_port = {port}
"""


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_two_typos_are_both_reported_by_validate_plan_and_up_and_nothing_starts(tmp_path):
    profile = tmp_path / "typos.toml"
    port = free_base_port(2)
    profile.write_text(DEMO_TYPOS.format(port=port))
    state = tmp_path / "state"
    for args in (
        ("profile", "validate", str(profile)),
        ("profile", "plan", str(profile)),
        ("up", "-d", str(profile), "--state-dir", str(state)),
    ):
        began = time.monotonic()
        result = tokenspeed(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        errors = _errors(result.stderr)
        assert len(errors) == 2, (args, result.stderr)
        # Each names the file:line, the profile key and the fix.
        assert (
            f"{profile}:3: [server] max_num_seq: is not a ServerArgs field (did you mean 'max_num_seqs'?)"
            in (errors[0])
        )
        assert (
            f"{profile}:6: [groups.dense] model: 'demoo' is neither a demo model (demo, demo-moe)"
            in errors[1]
        )
        assert "(did you mean 'demo'?)" in errors[1] and "set a demo name or the folder" in errors[1]
        print(f"{args[0]} {args[1]}: refused in {time.monotonic() - began:.1f}s")
    assert "2 problem(s); nothing was started" in result.stderr
    assert not (state / "supervisor.pid").exists() and not (state / "control.sock").exists()
    # A profile meant for another machine is still checked alone.
    profile.write_text(DEMO_TYPOS.format(port=port).replace("max_num_seq ", "max_num_seqs "))
    alone = tokenspeed("profile", "validate", "--no-preflight", str(profile))
    assert alone.returncode == 0, alone.stderr


def test_a_model_folder_without_config_is_named(tmp_path):
    (tmp_path / "weights").mkdir()
    profile = tmp_path / "folder.toml"
    profile.write_text(
        f'[server]\nmodel = "{tmp_path / "weights"}"\ndevice = "cpu"\n[fleet]\nbase_port = {free_base_port(1)}\n'
    )
    result = tokenspeed("profile", "validate", str(profile))
    assert result.returncode == 2
    assert (
        f"{profile}:2: [server] model: the folder {tmp_path / 'weights'} has no config.json" in result.stderr
    )


def test_a_second_fleet_on_taken_ports_is_refused_naming_each_port_and_a_free_base(make_fleet):
    first = make_fleet(replicas=2, name="pf-first")
    assert first.up().returncode == 0
    second = make_fleet(replicas=2, name="pf-second")
    second.profile.write_text(
        second.profile.read_text().replace(
            f"base_port = {second.base_port}", f"base_port = {first.base_port}"
        )
    )
    began = time.monotonic()
    result = second.up()
    assert result.returncode == 2, result.stdout + result.stderr
    print(f"refused in {time.monotonic() - began:.1f}s")
    errors = _errors(result.stderr)
    assert len(errors) == 2, result.stderr  # both servers' ports, at once
    pids = {s["name"]: s["pid"] for s in first.servers().values()}
    for i, error in enumerate(errors):
        port = first.base_port + 10 * i
        assert (
            f"[fleet] base_port: port {port} (pf-second-{i}'s HTTP port) is in use by pid {pids[f'pf-first-{i}']}"
            in error
        )
        assert "set [fleet] base_port to a free range (e.g. base_port = " in error
    assert not (second.state_dir / "supervisor.pid").exists()
    assert second.starts(second.server(0)) == 0 and second.starts(second.server(1)) == 0
    # The same fleet asked again attaches to itself: its own ports are no problem.
    again = first.up()
    assert again.returncode == 0 and "already supervised" in again.stdout, again.stderr


def test_a_state_directory_in_use_by_another_fleet_is_refused(make_fleet):
    first = make_fleet(replicas=1, name="pf-owner")
    assert first.up().returncode == 0
    other = make_fleet(replicas=1, name="pf-intruder")
    result = tokenspeed("up", "-d", str(other.profile), "--state-dir", str(first.state_dir))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"[fleet] name: the state directory {first.state_dir} is in use by running fleet 'pf-owner'"
        in result.stderr
    )
    assert f"`tokenspeed down --state-dir {first.state_dir}`" in result.stderr
    assert other.starts(other.server(0)) == 0


def test_a_start_that_fails_shows_why_in_status_not_an_unknown_exit(make_fleet):
    fleet = make_fleet(replicas=1, name="pf-start", max_restarts=2)
    assert fleet.up().returncode == 0
    name = fleet.server(0)
    with SupervisorClient(fleet.state_dir) as client:
        client.stop(name)
        fleet.wait_for(lambda s: s[name]["state"] == "STOPPED", what="stopped")
        # Something else takes the server's port while it is stopped: its next start cannot bind.
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", fleet.base_port))
            squatter.listen()
            client.start(name)
            servers = fleet.wait_for(lambda s: s[name]["state"] == "FATAL", timeout=60, what="FATAL")
    why = f"start failed: port {fleet.base_port} on 127.0.0.1 is already in use by another process"
    assert servers[name]["last_exit"]["reason"] == why
    assert servers[name]["error"].endswith(f"last exit: {why}"), servers[name]["error"]
    status = fleet.cli("status")
    assert why in status.stdout and "unknown" not in status.stdout, status.stdout
