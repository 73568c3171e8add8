"""--data-parallel-size 2 on CPU: both groups serve, under each load-balancing method.

The same servers then die on purpose (the last tests of this file, which run in order): a killed scheduler
rank ends its server with a non-zero status within 10 s; a killed server takes its controller and
schedulers with it.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_proc import launch_all
from tokenspeed.runtime.engine.data_parallel_controller import LOAD_BALANCE_METHODS

N_REQUESTS = 24


@pytest.fixture(scope="module")
def dp_servers(tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("dp-logs")
    specs = [
        (
            tiny_model,
            logs,
            (
                "--data-parallel-size",
                "2",
                "--load-balance-method",
                m,
                "--enable-metrics",
                "--skip-server-warmup",
                "--max-total-tokens",
                "8192",
            ),
        )  # fmt: skip
        for m in LOAD_BALANCE_METHODS
    ]
    servers = dict(zip(LOAD_BALANCE_METHODS, launch_all(specs), strict=True))
    yield servers
    for s in servers.values():
        if s.proc.poll() is None:
            assert s.stop(signal.SIGTERM) == 0, s.log()[-3000:]


async def _burst(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def one(i: int) -> dict:
            r = await c.post("/generate", json={"input_ids": [1, 10 + i, 20 + i, 30], "sampling_params": {
                "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}})  # fmt: skip
            assert r.status_code == 200, r.text
            return r.json()

        return await asyncio.gather(*(one(i) for i in range(N_REQUESTS)))


@pytest.mark.parametrize("method", LOAD_BALANCE_METHODS)
def test_both_groups_serve(dp_servers, method):
    srv = dp_servers[method]
    info = srv.server_info()
    assert info["load_balance_method"] == method
    assert set(info["child_pids"]) == {"data-parallel controller", "scheduler dp0 tp0", "scheduler dp1 tp0"}
    results = asyncio.run(_burst(srv.url))
    per_rank = collections.Counter(r["meta_info"]["dp_rank"] for r in results)
    assert set(per_rank) == {0, 1}, per_rank
    if method == "round_robin":
        assert per_rank[0] == per_rank[1] == N_REQUESTS // 2
    assert all(len(r["output_ids"]) == 16 for r in results)
    # Greedy output does not depend on the group that served it.
    again = asyncio.run(_burst(srv.url))
    assert [r["output_ids"] for r in again] == [r["output_ids"] for r in results]
    # Metrics carry both ranks.
    text = httpx.get(f"{srv.url}/metrics").text
    served = {
        s.labels["dp_rank"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "tokenspeed:generation_tokens_total"
    }
    assert served["0"] > 0 and served["1"] > 0
    assert served["0"] + served["1"] == 2 * N_REQUESTS * 16


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_killed_scheduler_takes_the_server_down(dp_servers):
    srv = dp_servers["round_robin"]
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    victim = srv.server_info()["child_pids"]["scheduler dp1 tp0"]
    assert victim in [c.pid for c in children]
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code = srv.proc.wait(timeout=10)
    assert code != 0
    assert time.monotonic() - t0 < 10
    assert "scheduler dp1 tp0" in srv.log() and "exited with code -9" in srv.log()
    gone, still = psutil.wait_procs(children, timeout=10)
    assert not _alive(still)


def test_children_die_with_a_killed_server(dp_servers):
    srv = dp_servers["shortest_queue"]
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    assert len(children) >= 3  # controller + two schedulers
    srv.proc.kill()
    srv.proc.wait(timeout=10)
    gone, still = psutil.wait_procs(children, timeout=10)
    assert not _alive(still)
