"""Every `--json` command answers in JSON when it fails too: {"error", "exit_code"} on stdout, the same exit
code as without --json, and the human message still on stderr."""

from __future__ import annotations

import json

from tests.console.conftest import tokenspeed


def _json_error(result, code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert body["exit_code"] == code and body["error"], body
    assert body["error"].splitlines()[0] in result.stderr  # the person watching reads the same words
    return body["error"]


def test_status_json_without_a_fleet(tmp_path):
    error = _json_error(tokenspeed("status", "--json", "--state-dir", str(tmp_path / "none")), 3)
    assert "no supervisor socket" in error
    plain = tokenspeed("status", "--state-dir", str(tmp_path / "none"))
    assert plain.returncode == 3 and plain.stdout == ""


def test_profile_show_and_plan_json_on_a_bad_profile(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nmodel = "demo"\ndevice = "cpu"\nmax_num_seqz = 4\n')
    for command in ("show", "plan"):
        error = _json_error(tokenspeed("profile", command, str(bad), "--json"), 2)
        assert "max_num_seqz" in error and "bad.toml:4" in error, error
    assert "file not found" in _json_error(
        tokenspeed("profile", "show", str(tmp_path / "nope.toml"), "--json"), 2
    )


def test_usage_errors_are_json_with_json_and_click_messages_without():
    for args in (
        ("status", "--json", "--bogus"),
        ("profile", "plan", "--json"),
        ("profile", "show", "--json"),
    ):
        result = tokenspeed(*args)
        assert result.returncode == 2, result.stdout + result.stderr
        body = json.loads(result.stdout)
        assert body["exit_code"] == 2 and body["error"] in result.stderr, (args, body)
    plain = tokenspeed("status", "--bogus")
    assert plain.returncode == 2 and plain.stdout == "" and "No such option '--bogus'" in plain.stderr
