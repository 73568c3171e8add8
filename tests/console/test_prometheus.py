"""The fleet as a real Prometheus sees it: file_sd targets kept by the supervisor, the scrape config of
`tokenspeed prometheus`, and every query of `tokenspeed grafana`'s dashboard answering with data.

One demo fleet (the quick start's profile with one dense and one MoE server, under its built-in load) and
one Debian `prometheus` process on loopback ports. A dashboard panel whose metric the fleet no longer
exports, or whose PromQL is wrong, answers nothing and fails the test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from console.monitoring.targets import TargetFiles
from tests.console.conftest import free_base_port, port_free, tokenspeed

ROOT = Path(__file__).resolve().parents[2]
DEMO_PROFILE = ROOT / "profiles" / "demo.toml"
PROMETHEUS = shutil.which("prometheus")
DENSE, MOE = "prom-dense-0", "prom-moe-0"
# What Grafana puts in place of the dashboard's variables ("All" is `.*`).
RATE_WINDOW = "30s"
SCRAPE_INTERVAL_S = 1.0

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no `prometheus` binary on PATH: `apt-get install -y prometheus` (.ci/run installs it)",
)


# Grafana's unit ids (packages/grafana-data/src/valueFormats/categories.ts) that a dashboard of this kind
# may use; custom units are spelled `suffix:<text>` (Grafana's documented form).
GRAFANA_UNITS = {
    "short", "none", "percent", "percentunit", "s", "ms", "µs", "ns", "m", "h", "d", "bytes", "decbytes",
    "bits", "Bps", "binBps", "bps", "reqps", "ops", "cps", "rps", "wps", "iops", "eps", "mps", "recps",
    "rowsps", "hertz", "locale", "dtdurations", "dthms", "dateTimeAsIso", "dateTimeFromNow",
}  # fmt: skip


def substitute(expr: str, fleet: str, server: str = ".*", model: str = ".*") -> str:
    return (
        expr.replace("$__rate_interval", RATE_WINDOW)
        .replace("$fleet", fleet)
        .replace("$server", server)
        .replace("$model", model)
    )


class Prometheus:
    def __init__(self, url: str):
        self.http = httpx.Client(base_url=url, trust_env=False, timeout=10)

    def _get(self, path: str, **params: str) -> dict:
        # Prometheus answers 503 "Service Unavailable" (plain text) while its storage is still opening:
        # raised as an httpx.HTTPError like a refused connection, which the waits below retry.
        response = self.http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def query(self, expr: str) -> list[dict]:
        body = self._get("/api/v1/query", query=expr)
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def targets(self) -> list[dict]:
        return self._get("/api/v1/targets", state="active")["data"]["activeTargets"]


def wait_until(check, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def free_port() -> int:
    return next(p for p in range(free_base_port(1) + 5, 65000) if port_free(p))


@pytest.fixture
def fleet_and_prometheus(tmp_path):
    base = free_base_port(2)
    profile = tmp_path / "prom.toml"
    # The quick start's demo fleet, one server of each model, so two cores also run Prometheus.
    profile.write_text(
        f'extends = "{DEMO_PROFILE}"\n\n[groups.dense]\nreplicas = 1\n\n'
        f'[fleet]\nname = "prom"\nbase_port = {base}\n'
    )
    state_dir = tmp_path / "state"
    procs: list[subprocess.Popen] = []
    yield profile, state_dir, tmp_path, procs
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    if state_dir.exists():
        tokenspeed("down", "--state-dir", str(state_dir), "--timeout", "15")


@needs_prometheus
def test_prometheus_follows_the_fleet_and_answers_every_dashboard_query(fleet_and_prometheus):
    profile, state_dir, tmp, procs = fleet_and_prometheus
    started = time.monotonic()
    up = tokenspeed("up", "-d", str(profile), "--state-dir", str(state_dir), "--timeout", "150", timeout=170)
    assert up.returncode == 0, up.stdout + up.stderr
    print(f"fleet READY {time.monotonic() - started:.1f}s")

    # The scrape config as an operator gets it, at 1 s so the test sees enough samples quickly.
    config = tokenspeed("prometheus", "--state-dir", str(state_dir), "--scrape-interval", f"{SCRAPE_INTERVAL_S:g}s")
    assert config.returncode == 0, config.stderr
    (tmp / "prometheus.yml").write_text(config.stdout)
    port = free_port()
    with open(tmp / "prometheus.log", "w") as log:
        procs.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
    prom = Prometheus(f"http://127.0.0.1:{port}")

    # Prometheus scrapes what the supervisor's files list: both servers and the supervisor's own port
    # (a port picked at start that only supervisor.json knows), with the file's labels.
    files = TargetFiles(state_dir)
    listed = json.loads(files.servers.read_text()) + json.loads(files.supervisor.read_text())

    def all_up():
        try:
            active = prom.targets()
        except httpx.HTTPError:
            return None
        return active if len(active) == 3 and all(t["health"] == "up" for t in active) else None

    try:
        active = wait_until(all_up, 30, "Prometheus to scrape 3 targets")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{(tmp / 'prometheus.log').read_text()[-2000:]}") from None
    print(f"targets up {time.monotonic() - started:.1f}s")
    scraped = {t["labels"]["instance"]: t["labels"] for t in active}
    for group in listed:
        labels = scraped[group["targets"][0]]
        assert {k: labels[k] for k in group["labels"]} == group["labels"]
    assert {scraped[g["targets"][0]].get("server") for g in listed} == {DENSE, MOE, None}
    assert scraped[listed[0]["targets"][0]]["model"] in ("demo", "demo-moe")

    # kill -9 one server: the supervisor restarts it, rewrites the targets, and Prometheus scrapes the new
    # process (its process_start_time_seconds is after the kill).
    start_query = f'process_start_time_seconds{{server="{DENSE}"}}'
    first = wait_until(lambda: prom.values(start_query), 20, "a first scrape of the dense server")[0]
    status = json.loads(tokenspeed("status", "--json", "--state-dir", str(state_dir)).stdout)
    pid = next(s["pid"] for s in status["servers"] if s["name"] == DENSE)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    new = wait_until(
        lambda: [v for v in prom.values(start_query) if v > killed_at], 90, "the restarted process"
    )
    assert new[0] > first
    restarts = prom.query(f'tokenspeed_fleet:server_restarts_total{{fleet="prom", server="{DENSE}"}}')
    counted = {r["metric"]["reason"]: float(r["value"][1]) for r in restarts}
    assert counted["signal"] == 1.0 and counted["operator"] == 0.0, counted  # the one kill -9, by its reason
    print(f"restarted process scraped {time.time() - killed_at:.1f}s after kill -9")

    # The supervisor dies and a new one re-adopts the fleet: its restart counts go on from the old one's
    # (the dashboard's "Restarts by reason" still says 1, as `tokenspeed status` does).
    old_supervisor = json.loads((state_dir / "supervisor.pid").read_text())["pid"]
    old_address = json.loads(files.supervisor.read_text())[0]["targets"][0]
    psutil.Process(old_supervisor).kill()
    psutil.Process(old_supervisor).wait(10)
    again = tokenspeed("up", "-d", str(profile), "--state-dir", str(state_dir), "--timeout", "150", timeout=170)
    assert again.returncode == 0, again.stdout + again.stderr
    new_address = wait_until(
        lambda: (g := json.loads(files.supervisor.read_text())) and g[0]["targets"][0] != old_address
        and g[0]["targets"][0], 30, "the new supervisor's target",
    )  # fmt: skip

    def counted_by_new_supervisor() -> dict | None:
        rows = prom.query(f'tokenspeed_fleet:server_restarts_total{{fleet="prom", server="{DENSE}"}}')
        mine = {r["metric"]["reason"]: float(r["value"][1]) for r in rows if r["metric"]["instance"] == new_address}
        return mine or None

    counted = wait_until(counted_by_new_supervisor, 30, "a scrape of the new supervisor")
    assert counted["signal"] == 1.0, counted
    status = json.loads(tokenspeed("status", "--json", "--state-dir", str(state_dir)).stdout)
    assert next(s["restarts"] for s in status["servers"] if s["name"] == DENSE) == 1

    # Every query of the shipped dashboard answers with at least one number over this fleet.
    board = json.loads(tokenspeed("grafana").stdout)
    from console.monitoring.grafana import panel_queries

    queries = panel_queries(board)
    assert len(queries) >= 20 and {v["name"] for v in board["templating"]["list"]} >= {
        "fleet",
        "server",
        "model",
    }

    def silent() -> list[str]:
        return [
            f"{title}: {expr}"
            for title, expr in queries
            if not any(math.isfinite(v) for v in prom.values(substitute(expr, "prom")))
        ]

    missing: list[str] = []

    def answered() -> bool:
        missing[:] = silent()
        return not missing

    try:
        wait_until(answered, 45, "every dashboard query to answer", poll=2)
    except AssertionError:
        raise AssertionError("dashboard queries without data:\n" + "\n".join(missing)) from None

    print(f"dashboard answered {time.monotonic() - started:.1f}s")
    # The same check as an operator runs it: every panel's query, with its latest values.
    # The restarted server is scraped while it loads; the check below reads its state once READY.
    ready_query = f'tokenspeed_fleet:server_state{{fleet="prom", server="{DENSE}", state="READY"}}'
    wait_until(lambda: 1.0 in prom.values(ready_query), 60, "the restarted server READY in Prometheus")
    check = tokenspeed(
        "grafana", "--check", f"http://127.0.0.1:{port}", "--fleet", "prom", "--rate-window", RATE_WINDOW
    )
    assert check.returncode == 0 and "NO DATA" not in check.stdout, check.stdout + check.stderr
    assert f"{DENSE} READY=1" in check.stdout, check.stdout

    # The CPU and memory panels count every process of a server (its scheduler holds the model), per
    # server, and follow the $server and $model filters.
    by_title: dict[str, str] = {}
    for title, expr in queries:
        by_title.setdefault(title, expr)  # the servers' query; the supervisor's own comes second
    memory = prom.query(substitute(by_title["Resident memory"], "prom", server=DENSE))
    kinds = {r["metric"].get("process"): float(r["value"][1]) for r in memory if "server" in r["metric"]}
    assert {r["metric"].get("server") for r in memory if "server" in r["metric"]} == {DENSE}, memory
    assert kinds.get("scheduler", 0) > 50e6 and kinds.get("front_end", 0) > 50e6, kinds
    dense_pid = next(s["pid"] for s in status["servers"] if s["name"] == DENSE)
    tree = [psutil.Process(dense_pid), *psutil.Process(dense_pid).children(recursive=True)]
    actual = sum(p.memory_info().rss for p in tree)
    assert 0.7 * actual < sum(kinds.values()) < 1.3 * actual, (kinds, actual)
    for title in ("CPU", "Resident memory"):
        only_moe = prom.query(substitute(by_title[title], "prom", model="demo-moe"))
        assert {r["metric"]["server"] for r in only_moe if "server" in r["metric"]} == {MOE}, (title, only_moe)

    # A stopped scheduler: the supervisor says STALLED, and Prometheus has it within one scrape interval.
    from console.client import SupervisorClient

    dense_url = next(s["url"] for s in status["servers"] if s["name"] == DENSE)
    scheduler = next(iter(httpx.get(dense_url + "/get_server_info", timeout=10).json()["child_pids"].values()))
    stalled_query = f'tokenspeed_fleet:server_state{{fleet="prom", server="{DENSE}", state="STALLED"}}'
    os.kill(scheduler, signal.SIGSTOP)
    try:
        with SupervisorClient(state_dir) as client:

            def supervisor_says_stalled() -> bool:
                return any(s["name"] == DENSE and s["state"] == "STALLED" for s in client.fleet()["servers"])

            wait_until(supervisor_says_stalled, 30, "the supervisor to say STALLED", poll=0.1)
        said = time.monotonic()
        wait_until(lambda: 1.0 in prom.values(stalled_query), 10, "STALLED in Prometheus", poll=0.1)
        lag = time.monotonic() - said
    finally:
        os.kill(scheduler, signal.SIGCONT)
    print(f"STALLED in Prometheus {lag:.2f}s after the supervisor said it")
    assert lag <= SCRAPE_INTERVAL_S + 0.5, lag  # one scrape, and the polling of this test
    wait_until(lambda: 1.0 in prom.values(ready_query), 30, "READY again once the scheduler runs")
    # A stopped server leaves the targets file, and Prometheus stops scraping it.
    from console.client import SupervisorClient

    with SupervisorClient(state_dir) as client:
        client.stop(DENSE)
    wait_until(
        lambda: all(t["labels"].get("server") != DENSE for t in prom.targets()),
        20,
        "the stopped server's target to go",
    )
    assert not any(g["labels"]["server"] == DENSE for g in json.loads(files.servers.read_text()))
    print(f"whole test {time.monotonic() - started:.1f}s")


def test_grafana_and_prometheus_commands(tmp_path):
    """Without a fleet: the dashboard is Grafana JSON over the variables, the scrape config names the files."""
    board = json.loads(tokenspeed("grafana").stdout)
    assert board["schemaVersion"] >= 38 and board["uid"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert {p["type"] for p in panels} >= {"timeseries", "heatmap", "state-timeline"}
    for panel in panels:
        assert panel["targets"] and all("$fleet" in t["expr"] for t in panel["targets"]), panel["title"]
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit in GRAFANA_UNITS or unit.startswith("suffix:"), (panel["title"], unit)
    # STALLED is a state the state panel can show; the process panels filter on server and model.
    assert "STALLED" in next(p for p in panels if p["title"] == "Server state")["description"]
    for title in ("CPU", "Resident memory"):
        exprs = [t["expr"] for t in next(p for p in panels if p["title"] == title)["targets"]]
        assert any("$server" in e and "$model" in e and "server_process_" in e for e in exprs), exprs
    state_dir = tmp_path / "fleet-x"
    (tmp_path / "key").write_text("secret\n")
    (tmp_path / "key").chmod(0o600)
    out = tokenspeed("prometheus", "--state-dir", str(state_dir), "--api-key-file", str(tmp_path / "key"))
    assert out.returncode == 0, out.stderr
    assert str(state_dir / "prometheus" / "servers.json") in out.stdout
    assert str(state_dir / "prometheus" / "supervisor.json") in out.stdout
    assert "credentials_file" in out.stdout
    promtool = shutil.which("promtool")
    if promtool:
        (tmp_path / "p.yml").write_text(out.stdout)
        check = subprocess.run(
            [promtool, "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_targets_list_every_node_of_a_multi_node_fleet():
    """Ray fleets: each server's target is its head node's address, whatever node the supervisor is on."""
    from console.monitoring.targets import server_targets
    from console.profile.schema import ProcessSpec, ServerSpec

    def spec(name: str, nodes: list[str], port: int) -> ServerSpec:
        procs = tuple(ProcessSpec(r, n, (0, 1), (), ()) for r, n in enumerate(nodes))
        return ServerSpec(name, 0, nodes[0], port, procs)

    class Args:
        model = "/models/Qwen3-30B-A3B"
        served_model_name = "qwen3"

    rows = [
        (spec("big-0", ["10.0.0.1", "10.0.0.2"], 30000), Args(), "READY"),
        (spec("big-1", ["10.0.0.3", "10.0.0.4"], 30010), Args(), "STARTING"),
        (spec("big-2", ["10.0.0.5", "10.0.0.6"], 30020), Args(), "BACKOFF"),
    ]
    # A server a profile reload just added, before its arguments are known: listed, model label empty.
    rows.append((spec("big-3", ["10.0.0.7", "10.0.0.8"], 30030), None, "STARTING"))
    groups = server_targets("big", rows)
    assert [g["targets"] for g in groups] == [["10.0.0.1:30000"], ["10.0.0.3:30010"], ["10.0.0.7:30030"]]
    assert groups[2]["labels"]["model"] == ""
    assert groups[0]["labels"] == {
        "fleet": "big", "server": "big-0", "group": "default", "node": "10.0.0.1", "model": "qwen3", "role": "server"
    }  # fmt: skip
