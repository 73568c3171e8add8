"""The supervisor's side of monitoring, over fake servers (fast): the file_sd targets follow starts, stops
and crashes; the supervisor's loopback /metrics counts restarts by reason and guards itself like the
servers do when the fleet has an api_key. (tests/console/test_prometheus.py runs a real Prometheus.)"""

from __future__ import annotations

import json
import os
import signal

import httpx

from console.client import SupervisorClient
from console.monitoring.targets import TargetFiles


def _targets(fleet) -> dict[str, dict]:
    groups = json.loads(TargetFiles(fleet.state_dir).servers.read_text())
    return {g["labels"]["server"]: g for g in groups}


def _supervisor_url(fleet) -> str:
    (group,) = json.loads(TargetFiles(fleet.state_dir).supervisor.read_text())
    assert group["labels"] == {"fleet": fleet.name, "role": "supervisor"}
    host, _, port = group["targets"][0].rpartition(":")
    assert host == "127.0.0.1"
    return f"http://{host}:{port}"


def _sample(text: str, line_start: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    assert len(values) == 1, (line_start, text)
    return values[0]


def test_targets_follow_the_fleet_and_restarts_are_counted_by_reason(make_fleet):
    fleet = make_fleet(replicas=2, name="mon")
    assert fleet.up().returncode == 0
    a, b = fleet.server(0), fleet.server(1)
    targets = _targets(fleet)
    assert set(targets) == {a, b}
    assert targets[a]["targets"] == [f"127.0.0.1:{fleet.base_port}"]
    assert targets[a]["labels"] == {
        "fleet": "mon", "server": a, "group": "default", "node": "127.0.0.1", "model": "fake-model", "role": "server"
    }  # fmt: skip
    url = _supervisor_url(fleet)
    http = httpx.Client(trust_env=False, timeout=5)

    # A crash: the target leaves while the server waits to restart, and comes back when it runs again.
    os.kill(fleet.servers()[a]["pid"], signal.SIGKILL)
    fleet.wait_for(lambda s: s[a]["restarts"] == 1 and s[a]["state"] == "READY", what="the restart")
    assert set(_targets(fleet)) == {a, b}
    fleet.cli("restart", b)
    fleet.wait_for(lambda s: s[b]["state"] == "READY" and s[b]["uptime_s"] < 10, what="the operator restart")
    # An operator's stop takes the server out of the targets.

    with SupervisorClient(fleet.state_dir) as client:
        client.stop(b)
    fleet.wait_for(lambda s: s[b]["state"] == "STOPPED", what="the stop")
    assert set(_targets(fleet)) == {a}

    text = http.get(url + "/metrics").text
    assert _sample(text, f'tokenspeed_fleet:server_restarts_total{{reason="signal",server="{a}"}}') == 1
    assert _sample(text, f'tokenspeed_fleet:server_restarts_total{{reason="operator",server="{b}"}}') == 1
    assert _sample(text, f'tokenspeed_fleet:server_restarts_total{{reason="exit_code",server="{a}"}}') == 0
    assert _sample(text, f'tokenspeed_fleet:server_state{{server="{b}",state="STOPPED"}}') == 1
    assert _sample(text, 'tokenspeed_fleet:servers{state="READY"}') == 1
    assert _sample(text, f'tokenspeed_fleet:health_check_seconds_count{{server="{a}"}}') > 0
    assert _sample(text, "process_resident_memory_bytes") > 0

    # A clean shutdown empties both files: nothing is left for Prometheus to scrape.
    assert fleet.cli("down").returncode == 0
    assert json.loads(TargetFiles(fleet.state_dir).servers.read_text()) == []
    assert json.loads(TargetFiles(fleet.state_dir).supervisor.read_text()) == []


def test_supervisor_metrics_want_the_fleets_api_key(make_fleet):
    fleet = make_fleet(replicas=1, name="keyed", server='api_key = "fleet-key"')
    assert fleet.up().returncode == 0
    url = _supervisor_url(fleet)
    with httpx.Client(trust_env=False, timeout=5) as http:
        assert http.get(url + "/metrics").status_code == 401
        assert http.get(url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = http.get(url + "/metrics", headers={"Authorization": "Bearer fleet-key"})
        assert ok.status_code == 200 and "tokenspeed_fleet:server_state" in ok.text
        assert http.get(url + "/health").status_code == 200  # like the servers: /health needs no key


def test_restart_reasons_from_what_the_unit_recorded():
    from types import SimpleNamespace

    from console.monitoring.fleet_metrics import restart_reason
    from console.supervisor.states import REASON_ADOPTED, REASON_UNHEALTHY, ExitInfo

    def unit(exit_info, error=None):
        return SimpleNamespace(last_exit=exit_info, error=error)

    assert restart_reason(unit(ExitInfo(3, None, 0.0))) == "exit_code"
    assert restart_reason(unit(ExitInfo(None, "SIGKILL", 0.0))) == "signal"
    assert restart_reason(unit(ExitInfo(0, None, 0.0, REASON_UNHEALTHY))) == "unhealthy"
    assert restart_reason(unit(ExitInfo(None, "SIGKILL", 0.0), "not healthy within startup_timeout_s=5")) == (
        "startup_timeout"
    )
    assert restart_reason(unit(ExitInfo(None, None, 0.0))) == "start_failed"
    assert restart_reason(unit(ExitInfo(None, None, 0.0, REASON_ADOPTED))) == "unknown"
