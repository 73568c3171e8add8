"""`tokenspeed console` refusals a script can rely on: exit codes and messages, nothing started."""

import subprocess
import sys


def console(*args: str, env_home: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", "console", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": env_home, "XDG_STATE_HOME": env_home},
    )


def test_attaching_to_a_fleet_that_does_not_run_exits_3(tmp_path):
    result = console("--fleet", "nosuch", env_home=str(tmp_path))
    assert result.returncode == 3
    assert "no supervisor answers" in result.stderr and "tokenspeed up" in result.stderr


def test_replay_of_a_directory_without_a_recording_exits_2(tmp_path):
    result = console("--replay", str(tmp_path), env_home=str(tmp_path))
    assert result.returncode == 2
    assert "--replay" in result.stderr and "history.sqlite" in result.stderr


def test_at_without_replay_is_refused(tmp_path):
    result = console("--fleet", "x", "--at", "-5m", env_home=str(tmp_path))
    assert result.returncode == 2
    assert "--at goes with --replay" in result.stderr


def test_bad_interval_is_refused(tmp_path):
    result = console("--interval", "0", "--fleet", "x", env_home=str(tmp_path))
    assert result.returncode == 2
    assert "--interval" in result.stderr
