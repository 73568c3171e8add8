"""Process life cycle: a dead scheduler takes the server down, a dead server takes its children with it,
SIGTERM drains and exits 0. The same servers also cover start-up variants (--skip-tokenizer-init,
--stream-interval with --stream-output, --warmups)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from tests.server.server_proc import launch_all


@pytest.fixture(scope="module")
def two_servers(tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("lifecycle-logs")
    servers = launch_all(
        [
            (tiny_model, logs, ("--skip-server-warmup", "--skip-tokenizer-init")),
            (tiny_model, logs, ("--warmups", "batch,chat", "--stream-interval", "4", "--stream-output")),
            (tiny_model, logs, ("--skip-server-warmup",)),
        ],
        env={"TOKENSPEED_DRAIN_TIMEOUT": "20"},
    )
    yield servers
    for s in servers:
        s.stop(signal.SIGKILL, timeout=10)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_skip_tokenizer_init_serves_token_ids(two_servers):
    srv = two_servers[0]
    r = httpx.post(f"{srv.url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4,
                   "ignore_eos": True}})  # fmt: skip
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 4 and r.json()["text"] == ""
    r = httpx.post(f"{srv.url}/generate", json={"text": "hello"})
    assert r.status_code == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"]


def test_stream_interval_batches_stream_chunks(two_servers):
    srv = two_servers[1]
    with httpx.stream("POST", f"{srv.url}/generate", timeout=60, json={"text": "count", "stream": True,
                      "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}) as r:  # fmt: skip
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    # --stream-output: each event carries only its new ids; --stream-interval 4: four at a time.
    assert [len(e["output_ids"]) for e in events] == [4, 4, 4]


def test_killed_scheduler_takes_the_server_down(two_servers):
    srv = two_servers[0]
    pids = srv.server_info()["child_pids"]
    sched_pid = pids["scheduler dp0 tp0"]
    children = _children(srv.proc.pid)
    assert sched_pid in [c.pid for c in children]
    t0 = time.monotonic()
    os.kill(sched_pid, signal.SIGKILL)
    code = srv.proc.wait(timeout=10)
    assert code != 0
    assert time.monotonic() - t0 < 10
    assert "exited with code -9" in srv.log()
    # No child outlives the server.
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_children_die_with_a_killed_server(two_servers):
    srv = two_servers[2]
    children = _children(srv.proc.pid)
    assert len(children) >= 1
    srv.proc.kill()
    srv.proc.wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE]


def test_sigterm_drains_in_flight_requests_then_exits_zero(two_servers):
    srv = two_servers[1]
    assert "warm-up batch" in srv.log() and "warm-up chat" in srv.log()
    children = _children(srv.proc.pid)
    result: dict = {}

    def long_request():
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            r = c.post("/generate", json={"text": "drain me", "sampling_params": {"max_new_tokens": 120,
                       "ignore_eos": True}})  # fmt: skip
            result["status"], result["body"] = r.status_code, r.json()

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and srv.server_info()["num_inflight_requests"] == 0:
        time.sleep(0.02)
    srv.proc.send_signal(signal.SIGTERM)
    # While draining: new work is refused with 503 (the listener may already be closing: then no answer).
    time.sleep(0.2)
    try:
        r = httpx.post(f"{srv.url}/generate", json={"text": "late"}, timeout=5)
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
    except httpx.TransportError:
        pass
    t.join(timeout=60)
    assert result["status"] == 200, json.dumps(result)
    assert result["body"]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(result["body"]["output_ids"]) == 120
    assert srv.proc.wait(timeout=30) == 0
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
