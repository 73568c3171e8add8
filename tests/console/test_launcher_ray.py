"""The Ray launcher on a local two-node Ray cluster: one agent per node, one process per node rank."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def processes_of(fleet) -> list[dict]:
    state = json.loads((fleet.state_dir / "state.json").read_text())
    return [p for s in state["servers"] for p in s["processes"]]


def test_two_node_server_through_ray_agents(ray_cluster, make_fleet):
    fleet = make_fleet(
        replicas=1,
        name="rayfleet",
        server="attn_tp_size = 2\nnnodes = 2",
        launcher="ray",
        nodes=["127.0.0.1", "127.0.0.1"],
        ray_address=ray_cluster.address,
    )
    result = fleet.up(timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    name = fleet.server(0)
    ranks = processes_of(fleet)
    assert [p["node_rank"] for p in ranks] == [0, 1]
    # One agent actor per Ray node, each running that node's rank.
    assert len({p["agent"] for p in ranks}) == 2
    assert all(psutil.pid_exists(p["pid"]) for p in ranks)
    server = fleet.servers()[name]
    assert server["state"] == "READY" and server["pids"] == [p["pid"] for p in ranks]
    # Prometheus finds the server at its head node (rank 0 serves HTTP) in the supervisor's file_sd targets.
    (target,) = json.loads((fleet.state_dir / "prometheus" / "servers.json").read_text())
    assert target["targets"] == [f"{server['host']}:{server['port']}"], target
    assert target["labels"]["server"] == name and target["labels"]["node"] == server["node"], target

    assert len(agent_processes()) == 2
    # Log lines of the non-HTTP rank travel back from its node into the server's log.
    deadline = time.monotonic() + 20
    while "node rank 1 waiting" not in fleet.cli("logs", name).stdout:
        assert time.monotonic() < deadline, fleet.cli("logs", name).stdout
        time.sleep(0.5)

    # One rank dies: the whole server restarts, on both nodes.
    psutil.Process(ranks[1]["pid"]).kill()
    after = fleet.wait_for(
        lambda s: s[name]["state"] == "READY" and s[name]["pids"] and ranks[0]["pid"] not in s[name]["pids"],
        timeout=60,
        what="the two-node restart",
    )[name]
    assert after["restarts"] == 1 and after["last_exit"]["signal"] == "SIGKILL"
    assert not psutil.pid_exists(ranks[0]["pid"]) or psutil.Process(ranks[0]["pid"]).status() == "zombie"
    new_ranks = processes_of(fleet)

    # The supervisor crashes; the detached agents keep the ranks running and a new one re-adopts them.
    psutil.Process(fleet.supervisor_pid()).kill()
    again = fleet.up(timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert fleet.servers()[name]["pids"] == [p["pid"] for p in new_ranks]

    processes = [psutil.Process(p["pid"]) for p in new_ranks]
    assert fleet.cli("down", timeout=120).returncode == 0
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert alive == []
    # The agents had nothing left to run and were killed with the fleet (their workers are gone).
    deadline = time.monotonic() + 30
    while agent_processes():
        assert time.monotonic() < deadline, agent_processes()
        time.sleep(0.5)


def agent_processes() -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "NodeAgent" in cmdline:
            found.append(cmdline)
    return found


def test_two_node_tiny_model_fleet_on_cpu_through_ray(ray_cluster, make_tiny_fleet):
    import httpx

    fleet = make_tiny_fleet(
        "raytiny",
        "attn_tp_size = 2\nnnodes = 2\nmax_model_len = 256\nmax_num_seqs = 4",
        launcher="ray",  # the real `tokenspeed serve --node-rank i` on each node
        nodes=["127.0.0.1", "127.0.0.1"],
        ray_address=ray_cluster.address,
        dist_init_port=fleet_port_hint(),
    )
    (fleet.profile).write_text(fleet.profile.read_text() + 'GLOO_SOCKET_IFNAME = "lo"\n')
    result = fleet.up("--timeout", "360", timeout=400)
    assert result.returncode == 0, (
        result.stdout + result.stderr + fleet.cli("logs", "raytiny-0", "-n", "60").stdout
    )
    ranks = processes_of(fleet)
    assert [p["node_rank"] for p in ranks] == [0, 1] and len({p["agent"] for p in ranks}) == 2
    server = fleet.servers()["raytiny-0"]
    response = httpx.post(
        server["url"] + "/v1/completions",
        json={"model": fleet.model, "prompt": "Hello there", "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    # Both ranks' logs arrive in the server's log: node rank 1 reports its tensor-parallel rank.
    deadline = time.monotonic() + 30
    while "rank 1: attention TP 1/2" not in fleet.cli("logs", "raytiny-0", "-n", "400").stdout:
        assert time.monotonic() < deadline
        time.sleep(1)
    processes = [psutil.Process(p["pid"]) for p in ranks]
    family = processes + [c for p in processes for c in p.children(recursive=True)]
    assert fleet.cli("down", "--timeout", "60", timeout=120).returncode == 0
    _, alive = psutil.wait_procs(family, timeout=15)
    assert alive == []


def fleet_port_hint() -> int:
    from tests.console.conftest import free_base_port

    return free_base_port(1) + 5
