"""The `tokenspeed` command line as a user runs it: a real subprocess of the installed entry point."""

import subprocess
import sys

from tokenspeed.config import cli

SUBCOMMANDS = ["serve", "up", "down", "status", "logs", "restart", "console", "profile", "bench", "ps"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_every_subcommand():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert f"  {name}" in result.stdout, name


def test_profile_group_lists_its_commands():
    result = run("profile", "--help")
    assert result.returncode == 0
    for name in ("validate", "show", "plan", "new"):
        assert f"  {name}" in result.stdout


def test_serve_help_lists_every_server_args_flag():
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_cli_args(parser)
    flags = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    assert len(flags) > 100  # the seed has well over a hundred flags
    result = run("serve", "--help")
    assert result.returncode == 0, result.stderr
    missing = [flag for flag in flags if flag not in result.stdout]
    assert missing == []


def test_serve_rejects_an_unknown_flag_with_argparse_error():
    result = run("serve", "some/model", "--no-such-flag")
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr


def test_unknown_subcommand_is_a_usage_error():
    result = run("launch")
    assert result.returncode == 2
    assert "No such command" in result.stderr
