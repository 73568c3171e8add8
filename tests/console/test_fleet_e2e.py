"""`tokenspeed up` on a real tiny model on CPU, a request through the fleet, then `tokenspeed down`."""

from __future__ import annotations

import json
import time

import httpx
import psutil

from console.client import SupervisorClient


def test_up_serves_a_tiny_model_and_down_leaves_no_process(make_tiny_fleet):
    fleet = make_tiny_fleet(
        "e2e",
        # With an API key every route but /health needs it: the supervisor's scrapes and proxies send it.
        'max_model_len = 256\nmax_num_seqs = 4\napi_key = "fleet-key"',
        metrics_interval_s=1.0,
    )
    result = fleet.up("--timeout", "360", timeout=400)
    assert result.returncode == 0, (
        result.stdout + result.stderr + fleet.cli("logs", "e2e-0", "-n", "80").stdout
    )

    status = fleet.status()
    assert status["fleet"] == "e2e"
    (server,) = status["servers"]
    for key in ("name", "node", "state", "pid", "port", "url", "restarts", "last_exit"):
        assert key in server
    assert (server["name"], server["state"], server["restarts"], server["last_exit"]) == (
        "e2e-0",
        "READY",
        0,
        None,
    )

    response = httpx.post(
        server["url"] + "/v1/completions",
        json={"model": fleet.model, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0},
        headers={"Authorization": "Bearer fleet-key"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(server["url"] + "/metrics").status_code == 401

    with SupervisorClient(fleet.state_dir) as client:
        # The supervisor's 1 Hz scrape sees the request in the server's own metrics.
        deadline = time.monotonic() + 60
        while True:
            metrics = client.fleet()["servers"][0]["metrics"]
            if metrics and (metrics["requests_total"] or 0) >= 1:
                break
            assert time.monotonic() < deadline, metrics
            time.sleep(0.5)
        assert 0 <= metrics["kv_usage"] <= 1 and metrics["running"] is not None
        assert "tokenspeed:num_requests_running" in client.raw_metrics("e2e-0")
        assert client.history("e2e-0", seconds=120)["samples"]
        info = client.info("e2e-0")
        assert json.dumps(info)  # the server's own /get_server_info, through the supervisor
        assert any(
            "Uvicorn running" in ln or "ready" in ln.lower() for ln in client.logs("e2e-0", 200)["lines"]
        )

    processes = fleet.processes()  # supervisor, the server and its scheduler processes
    assert len(processes) >= 3
    down = fleet.cli("down", "--timeout", "60", timeout=90)
    assert down.returncode == 0, down.stderr
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert alive == []
    # The server went down on SIGTERM by itself, well inside stop_timeout: no SIGKILL was needed.
    final = json.loads((fleet.state_dir / "state.json").read_text())["servers"][0]
    assert final["state"] == "STOPPED" and final["last_exit"]["signal"] is None
    assert "SIGKILL" not in (fleet.state_dir / "logs" / "e2e-0.log").read_text()
