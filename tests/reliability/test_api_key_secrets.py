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
from tests.tiny_models import make_tiny_model
from tokenspeed.config.cli import prepare_server_args

make_fleet = console_fleets.make_fleet


def _cmdlines(pid: int) -> list[bytes]:
    """The raw command line of `pid` and of everything it started (what `ps` shows any local user)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return [Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in procs]


def _key_file(tmp_path: Path, key: str, mode: int) -> Path:
    path = tmp_path / f"key-{mode:o}"
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


def test_a_profile_key_reaches_its_servers_by_environment_and_the_supervisor_uses_it(make_fleet, tmp_path):
    key = "profile-secret-7c1e"
    model = make_tiny_model("llama", tmp_path / "models")
    fleet = make_fleet(
        replicas=1,
        name="keyed",
        model=model,
        server=f'max_model_len = 256\nmax_num_seqs = 4\napi_key = "{key}"',
        command=None,  # the real `tokenspeed serve`
        restart="on-failure",
        startup_timeout_s=300,
        stop_timeout_s=30,
        metrics_interval_s=1.0,
    )
    # A health path behind the key: READY only if the supervisor's checks carry it.
    profile = fleet.profile.read_text().replace("[fleet.health]", '[fleet.health]\npath = "/v1/models"')
    # The built-in load generator sends it too.
    load = "[load]\nrate_per_s = 4\nmax_tokens = 2\nchat_fraction = 0\nshared_prefix_fraction = 0\n"
    fleet.profile.write_text(profile + load)
    result = fleet.up("--timeout", "360", timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr + fleet.cli("logs", "keyed-0").stdout
    server = fleet.servers()["keyed-0"]
    assert server["state"] == "READY"

    cmdlines = _cmdlines(server["pid"])
    assert len(cmdlines) >= 2  # the HTTP process and its scheduler
    assert all(key.encode() not in cmdline for cmdline in cmdlines), cmdlines
    assert f"TOKENSPEED_API_KEY={key}".encode() in Path(f"/proc/{server['pid']}/environ").read_bytes()

    assert httpx.get(server["url"] + "/v1/models", timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(server["url"] + "/v1/models", headers=auth, timeout=10).status_code == 200
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
