"""Fleet commands that must not guess: the `down` that `up` prints stops exactly that fleet, the documented
exit codes (console/cli.py: 2 bad usage, 3 no running fleet) hold with several fleets and with none, and a
wrong server name is refused with the real names. Real supervisors over `supervised_http.py` servers."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from tests.console.conftest import FAKE_SERVER, free_base_port, tokenspeed, write_profile


def _run(command: str, env: dict) -> subprocess.CompletedProcess:
    """A command line exactly as printed (`tokenspeed down --fleet a`), through this Python."""
    argv = shlex.split(command)
    assert argv[0] == "tokenspeed", command
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def _hint(stdout: str) -> str:
    found = re.search(r"`(tokenspeed down [^`]+)` stops it", stdout)
    assert found, stdout
    return found.group(1)


def test_up_prints_the_down_that_stops_it_and_exit_codes_hold_with_two_fleets(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}
    control = tmp_path / "ctl"
    control.mkdir()
    profiles = {}
    for name in ("ga", "gb"):
        profiles[name] = tmp_path / f"{name}.toml"
        write_profile(profiles[name], name, free_base_port(1), control, replicas=1)
    assert str(FAKE_SERVER) in profiles["ga"].read_text()
    try:
        # No fleet at all: 3 for every command that needs one (logs used to fail with a traceback).
        for args in (("down",), ("status",), ("ps",), ("logs", "ga-0"), ("restart", "ga-0")):
            result = tokenspeed(*args, env=env)
            assert result.returncode == 3, (args, result.stderr)
            assert "Traceback" not in result.stderr and "no running fleet" in result.stderr, (
                args,
                result.stderr,
            )

        hints = {}
        for name, profile in profiles.items():
            up = tokenspeed("up", "-d", str(profile), env=env)
            assert up.returncode == 0, up.stdout + up.stderr
            hints[name] = _hint(up.stdout)
        assert hints == {"ga": "tokenspeed down --fleet ga", "gb": "tokenspeed down --fleet gb"}

        # Two fleets: a command that must pick one is bad usage (2), naming the choice, not "no fleet" (3).
        for args in (("down",), ("status",), ("ps",), ("logs", "ga-0"), ("restart", "ga-0")):
            result = tokenspeed(*args, env=env)
            assert result.returncode == 2, (args, result.stderr)
            assert "several fleets are running (ga, gb); choose one with --fleet NAME" in result.stderr, args

        # A wrong server name lists the real ones (the log and the restart alike).
        for args in (("logs", "demo-0"), ("restart", "demo-0")):
            result = tokenspeed(*args, "--fleet", "ga", env=env)
            assert result.returncode == 2, (args, result.stderr)
            assert "no server named 'demo-0' in fleet 'ga'" in result.stderr, result.stderr
            assert "its servers: ga-0" in result.stderr, result.stderr
        assert "did you mean 'ga-0'" in tokenspeed("logs", "g-0", "--fleet", "ga", env=env).stderr

        # The printed command stops its fleet and leaves the other running.
        down = _run(hints["ga"], env)
        assert down.returncode == 0, down.stderr
        status = tokenspeed("status", env=env)  # the only fleet left is found without --fleet
        assert status.returncode == 0 and "fleet gb" in status.stdout, status.stdout + status.stderr
        assert _run(hints["ga"], env).returncode == 3  # nothing left to stop there
    finally:
        for name in profiles:
            tokenspeed("down", "--fleet", name, "--timeout", "10", env=env)


def test_up_with_a_state_dir_prints_a_down_with_that_state_dir(make_fleet):
    fleet = make_fleet(replicas=1, name="gs")
    up = fleet.up()
    assert up.returncode == 0, up.stderr
    hint = _hint(up.stdout)
    assert hint == f"tokenspeed down --state-dir {shlex.quote(str(fleet.state_dir))}"
    assert _run(hint, {}).returncode == 0
    assert fleet.cli("status").returncode == 3
