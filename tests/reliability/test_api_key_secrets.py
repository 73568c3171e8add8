"""The API key stays off command lines: `--api-key-file`, `$TOKENSPEED_API_KEY`, and a profile's key
handed to the fleet's servers by environment (every local user can read /proc/PID/cmdline)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import psutil
import pytest

from console.client import SupervisorClient
from tests.console import conftest as console_fleets
from tokenspeed.config.cli import prepare_server_args

make_fleet = console_fleets.make_fleet
make_tiny_fleet = console_fleets.make_tiny_fleet


def _cmdlines(pid: int) -> list[bytes]:
    """The raw command line of `pid` and of everything it started (what `ps` shows any local user)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return [Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in procs]


def _key_file(tmp_path: Path, key: str, mode: int) -> Path:
    path = tmp_path / f"key-{mode:o}"
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


def test_a_profile_key_reaches_its_servers_by_environment_and_the_supervisor_uses_it(make_tiny_fleet, tmp_path):
    key = "profile-secret-7c1e"
    fleet = make_tiny_fleet(
        "keyed", f'max_model_len = 256\nmax_num_seqs = 4\napi_key = "{key}"', metrics_interval_s=1.0
    )
    # A health path behind the key: READY only if the supervisor's checks carry it.
    profile = fleet.profile.read_text().replace("[fleet.health]", '[fleet.health]\npath = "/v1/models"')
    # The built-in load generator sends it too.
    load = "[load]\nrate_per_s = 4\nmax_tokens = 2\nchat_fraction = 0\nshared_prefix_fraction = 0\n"
    fleet.profile.write_text(profile + load)
    fleet.profile.chmod(0o644)
    result = fleet.up("--timeout", "360", timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr + fleet.cli("logs", "keyed-0").stdout
    # A profile holding a key that others can read is warned about (and still started).
    assert f"{fleet.profile} sets [server] api_key and is readable by group or others (mode 0644)" in (
        result.stderr
    ), result.stderr
    server = fleet.servers()["keyed-0"]
    assert server["state"] == "READY"

    cmdlines = _cmdlines(server["pid"])
    assert len(cmdlines) >= 2  # the HTTP process and its scheduler
    assert all(key.encode() not in cmdline for cmdline in cmdlines), cmdlines
    assert f"TOKENSPEED_API_KEY={key}".encode() in Path(f"/proc/{server['pid']}/environ").read_bytes()

    assert httpx.get(server["url"] + "/v1/models", timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(server["url"] + "/v1/models", headers=auth, timeout=10).status_code == 200
    # The scheme is case-insensitive (RFC 7235), at the servers as at the supervisor's metrics route.
    supervisor_metrics = "http://" + json.loads(
        (fleet.state_dir / "prometheus" / "supervisor.json").read_text()
    )[0]["targets"][0] + "/metrics"
    for scheme in ("bearer", "BEARER", "bEaReR"):
        cased = {"Authorization": f"{scheme} {key}"}
        assert httpx.get(server["url"] + "/v1/models", headers=cased, timeout=10).status_code == 200, scheme
        assert httpx.get(supervisor_metrics, headers=cased, timeout=10).status_code == 200, scheme
    for wrong in (f"Basic {key}", f"Bearer {key}x", key):
        assert httpx.get(server["url"] + "/v1/models", headers={"Authorization": wrong}).status_code == 401
        assert httpx.get(supervisor_metrics, headers={"Authorization": wrong}).status_code == 401

    # `tokenspeed prometheus` for this keyed fleet: refused without a key file, and with one others can
    # read; with a private one, its scrape config sends the key.
    state = str(fleet.state_dir)
    refused = console_fleets.tokenspeed("prometheus", "--state-dir", state)
    assert refused.returncode == 2 and "require an API key: pass --api-key-file FILE" in refused.stderr
    readable = _key_file(tmp_path, key, 0o644)
    refused = console_fleets.tokenspeed("prometheus", "--state-dir", state, "--api-key-file", str(readable))
    assert refused.returncode == 2 and "mode 0644" in refused.stderr and f"chmod 600 {readable}" in refused.stderr
    private = _key_file(tmp_path, key, 0o600)
    config = console_fleets.tokenspeed("prometheus", "--state-dir", state, "--api-key-file", str(private))
    assert config.returncode == 0, config.stderr
    assert "type: Bearer" in config.stdout and f'credentials_file: "{private.resolve()}"' in config.stdout
    # The supervisor scrapes /metrics with the key, and its load generator is answered.
    fleet.wait_for(lambda s: s["keyed-0"]["metrics"] is not None, timeout=30, what="a scrape")
    with SupervisorClient(fleet.state_dir) as client:
        deadline = time.monotonic() + 30
        while (load := client.fleet()["load"])["ok"] < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
    # Without the key every request would be refused (401): answers prove it is sent.
    assert load["ok"] >= 2, load

    show = console_fleets.tokenspeed("profile", "show", str(fleet.profile))
    assert show.returncode == 0, show.stderr
    assert key not in show.stdout and "TOKENSPEED_API_KEY=<secret>" in show.stdout


def test_serve_takes_the_key_from_a_private_file_or_the_environment(tmp_path):
    """The real command resolves the key from each source (`--print-config` stops before the model
    loads; the fleet test above shows a running server requiring the key it got this way)."""
    private = _key_file(tmp_path, "from-file", 0o600)
    env = {"TOKENSPEED_API_KEY": ""}
    shown = console_fleets.tokenspeed(
        "serve", "demo", "--device", "cpu", "--api-key-file", str(private), "--print-config", env=env
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["server_args"]["api_key"] == "from-file"
    shown = console_fleets.tokenspeed(
        "serve", "demo", "--device", "cpu", "--print-config", env={"TOKENSPEED_API_KEY": "from-env"}
    )
    assert json.loads(shown.stdout)["server_args"]["api_key"] == "from-env"
    # A key file others can read is refused before anything starts.
    readable = _key_file(tmp_path, "from-file", 0o640)
    refused = console_fleets.tokenspeed(
        "serve", "demo", "--device", "cpu", "--api-key-file", str(readable), env=env
    )
    assert refused.returncode == 2
    assert (
        f"--api-key-file {readable}: mode 0640" in refused.stderr
        and f"chmod 600 {readable}" in refused.stderr
    )
    assert "--api-key-file PATH" in console_fleets.tokenspeed("serve", "--help").stdout


def test_key_sources_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSPEED_API_KEY", "from-env")
    assert prepare_server_args(["demo", "--device", "cpu"]).api_key == "from-env"
    assert prepare_server_args(["demo", "--device", "cpu", "--api-key", "flag"]).api_key == "flag"
    private = _key_file(tmp_path, "from-file", 0o600)
    assert (
        prepare_server_args(["demo", "--device", "cpu", "--api-key-file", str(private)]).api_key
        == "from-file"
    )

    with pytest.raises(ValueError, match="both give the API key"):
        prepare_server_args(["demo", "--device", "cpu", "--api-key", "x", "--api-key-file", str(private)])
    with pytest.raises(ValueError, match="no such file"):
        prepare_server_args(["demo", "--device", "cpu", "--api-key-file", str(tmp_path / "missing")])


def test_key_files_others_can_read_are_refused_by_every_command_and_profiles_warned(tmp_path):
    """`tokenspeed prometheus --api-key-file` refuses a 0644 file as `serve` does; a keyed fleet's state
    (what its supervisor records) makes the file required; `profile validate` warns of a readable key."""
    state_dir = tmp_path / "fleet"
    state_dir.mkdir()
    (state_dir / "state.json").write_text(json.dumps({"fleet": "k", "keyed": True, "servers": []}))
    refused = console_fleets.tokenspeed("prometheus", "--state-dir", str(state_dir))
    assert refused.returncode == 2 and "--api-key-file FILE" in refused.stderr, refused.stderr
    for mode in (0o644, 0o640, 0o604):
        readable = _key_file(tmp_path, "k", mode)
        out = console_fleets.tokenspeed("prometheus", "--state-dir", str(state_dir), "--api-key-file", str(readable))
        assert out.returncode == 2 and f"mode {mode:04o}" in out.stderr and "chmod 600" in out.stderr, out.stderr
    empty = _key_file(tmp_path, "", 0o600)
    out = console_fleets.tokenspeed("prometheus", "--state-dir", str(state_dir), "--api-key-file", str(empty))
    assert out.returncode == 2 and "the file is empty" in out.stderr
    # An unkeyed fleet needs no key file.
    (state_dir / "state.json").write_text(json.dumps({"fleet": "k", "keyed": False, "servers": []}))
    out = console_fleets.tokenspeed("prometheus", "--state-dir", str(state_dir))
    assert out.returncode == 0 and "authorization" not in out.stdout

    demo = Path(__file__).resolve().parents[2] / "profiles" / "demo.toml"
    for table, line in (("server", 'api_key = "s3cret"'), ("env", 'TOKENSPEED_API_KEY = "s3cret"')):
        profile = tmp_path / f"{table}.toml"
        profile.write_text(f'extends = "{demo}"\n[{table}]\n{line}\n')
        profile.chmod(0o644)
        warned = console_fleets.tokenspeed("profile", "validate", str(profile))
        assert warned.returncode == 0, warned.stderr
        assert f"{profile} sets [{table}]" in warned.stderr and f"chmod 600 {profile}" in warned.stderr
        assert "s3cret" not in warned.stderr + warned.stdout
        profile.chmod(0o600)
        quiet = console_fleets.tokenspeed("profile", "validate", str(profile))
        assert quiet.returncode == 0 and "readable" not in quiet.stderr
