"""A hung scheduler is noticed and healed: real supervisor, real `tokenspeed serve`, real SIGSTOP.

The scheduler process is stopped (its HTTP front end keeps answering): the server's /health turns 503
once the scheduler has been silent for TOKENSPEED_SCHEDULER_TIMEOUT (it sends a heartbeat every second,
idle or busy), the stream in flight ends with an error instead of hanging, new requests get 503, the
supervisor shows STALLED and restarts the server after `unhealthy_restart_after_s` with reason "stalled"
(in `tokenspeed status`, the state file and the restart-reason metric), and the server is READY again.
The same holds for an idle server, where no request would have revealed the stall.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil

from tests.console import conftest as console_fleets
from tests.console.waiting import wait_until
from tokenspeed.runtime.engine.scheduler_liveness import SchedulerLiveness

make_fleet = console_fleets.make_fleet
make_tiny_fleet = console_fleets.make_tiny_fleet

SCHEDULER_TIMEOUT_S = 4
STALL_AFTER_S = 2
RESTART_AFTER_S = 10


def _scheduler_pid(url: str) -> int:
    children = httpx.get(url + "/get_server_info", timeout=10).json()["child_pids"]
    assert len(children) == 1, children  # one rank: its scheduler process
    return next(iter(children.values()))


def _health(url: str) -> tuple[int, dict]:
    try:
        r = httpx.get(url + "/health", timeout=5)
        return r.status_code, r.json()
    except httpx.HTTPError:
        return 0, {}


def _stream(url: str, started: threading.Event, seen: dict) -> None:
    """One streaming completion, read line by line: its events, and how it ended."""
    body = {"prompt": "Once upon", "max_tokens": 400, "stream": True, "ignore_eos": True}
    seen["events"] = []
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            seen["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    seen["events"].append(json.loads(line[6:]))
                    started.set()
    except httpx.HTTPError as exc:
        seen["transport_error"] = repr(exc)
    seen["ended_at"] = time.monotonic()
    started.set()


def _stop_scheduler_until_restarted(fleet, name: str, busy: bool) -> dict:
    server = fleet.servers()[name]
    url, front = server["url"], server["pid"]
    scheduler = _scheduler_pid(url)
    seen: dict = {}
    if busy:
        started = threading.Event()
        reader = threading.Thread(target=_stream, args=(url, started, seen), daemon=True)
        reader.start()
        assert started.wait(60) and seen["events"], seen  # the stream is under way
    stopped_at = time.monotonic()
    os.kill(scheduler, signal.SIGSTOP)
    try:
        fleet.wait_for(lambda s: s[name]["state"] == "STALLED", timeout=30, what="STALLED")
        stalled_s = time.monotonic() - stopped_at
        code, body = wait_until(lambda: (h := _health(url))[0] == 503 and h, 30, "/health 503")
        health_s = time.monotonic() - stopped_at
        assert body["status"] == "stalled" and "TOKENSPEED_SCHEDULER_TIMEOUT" in body["message"], body
        refused = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and "not responded" in refused.json()["error"]["message"]
        if busy:
            reader.join(60)
            assert not reader.is_alive(), "the stream hung"
            last = seen["events"][-1]
            assert "error" in last and "scheduler has not responded" in last["error"]["message"], last
            assert all(c.get("finish_reason") != "stop" for e in seen["events"] for c in e.get("choices", []))
            # Cut by the server's own bound, well before the supervisor's restart would have ended it.
            assert seen["ended_at"] - stopped_at < RESTART_AFTER_S, seen["ended_at"] - stopped_at
        servers = fleet.wait_for(
            lambda s: s[name]["state"] == "READY" and s[name]["pid"] != front, timeout=180, what="a restart"
        )
        ready_s = time.monotonic() - stopped_at
    finally:
        if psutil.pid_exists(scheduler):
            os.kill(scheduler, signal.SIGCONT)
    print(f"{'busy' if busy else 'idle'}: STALLED after {stalled_s:.1f}s, /health 503 after {health_s:.1f}s, "
          f"READY again after {ready_s:.1f}s (SIGSTOP to READY)")  # fmt: skip
    assert _health(servers[name]["url"])[0] == 200
    return servers[name]


def test_a_stopped_scheduler_is_503_ends_its_stream_with_an_error_and_is_restarted(make_tiny_fleet):
    fleet = make_tiny_fleet(
        "hang", "max_model_len = 512\nmax_num_seqs = 4", stop_timeout_s=10, metrics_interval_s=0.5
    )
    text = fleet.profile.read_text().replace("[env]", f'[env]\nTOKENSPEED_SCHEDULER_TIMEOUT = "{SCHEDULER_TIMEOUT_S}"')
    text += f"\n[supervisor]\nstall_after_s = {STALL_AFTER_S}\nunhealthy_restart_after_s = {RESTART_AFTER_S}\n"
    fleet.profile.write_text(text)
    name = fleet.server(0)
    result = fleet.up("--timeout", "300", timeout=330)
    assert result.returncode == 0, result.stdout + result.stderr + fleet.cli("logs", name).stdout

    server = _stop_scheduler_until_restarted(fleet, name, busy=True)
    assert server["restarts"] == 1 and server["last_exit"]["reason"] == "stalled", server
    # An idle server: nothing in flight, only the missing heartbeat shows the stall.
    server = _stop_scheduler_until_restarted(fleet, name, busy=False)
    assert server["restarts"] == 2 and server["last_exit"]["reason"] == "stalled", server

    log = (fleet.state_dir / "logs" / f"{name}.log").read_text()
    assert f"(unhealthy_restart_after_s={RESTART_AFTER_S}): restarting, reason stalled" in log
    assert "STALLED: no scheduler step or heartbeat for" in log
    status = fleet.cli("status")
    assert "stalled" in status.stdout, status.stdout
    # The restart-reason metric counts both, under their reason.
    target = json.loads((fleet.state_dir / "prometheus" / "supervisor.json").read_text())[0]["targets"][0]
    metrics = httpx.get(f"http://{target}/metrics", timeout=10).text
    assert f'tokenspeed_fleet:server_restarts_total{{reason="stalled",server="{name}"}} 2.0' in metrics, [
        line for line in metrics.splitlines() if "restarts_total" in line
    ]


def test_liveness_judges_silence_only_on_ticks_that_ran_on_time():
    live = SchedulerLiveness(timeout_s=5.0)
    live.start(2, now=100.0)
    assert live.check(now=100.5) == (None, False)
    live.heard(0, now=104.0)
    live.check(now=104.5)
    stalled, changed = live.check(now=105.0)  # dp1 silent for 5 s
    assert changed and "dp1 for 5s" in stalled and "dp0" not in stalled
    assert live.ages(now=105.0) == {0: 1.0, 1: 5.0}
    live.heard(1, now=105.2)
    assert live.check(now=105.5) == (None, True)  # heard again: no longer stalled
    # The front end's own loop was blocked for 10 s: the socket's backlog is read before judging.
    assert live.check(now=115.5) == (None, False)
    assert live.check(now=116.0)[0] is not None
    assert SchedulerLiveness(timeout_s=0).check(now=1e9) == (None, False)


def test_silence_during_the_warm_up_is_left_to_the_start_up_deadline():
    # On a fresh H200 the warm-up request's first step compiled FlashInfer kernels for ~100 s: judged at
    # 30 s, the warm-up failed and the supervisor restarted the server in a loop.
    live = SchedulerLiveness(timeout_s=5.0)
    live.start(1, now=0.0)
    with live.warming_up():
        for tick in range(1, 100):  # 49.5 s of silence, on ticks that ran on time
            assert live.check(now=tick * 0.5) == (None, False)
        live.heard(0, now=50.0)  # the warm-up's answer
    # After the warm-up a silent rank is judged as before: stalled once 5 s pass without a word.
    seen = [live.check(now=50.0 + tick * 0.5) for tick in range(1, 11)]
    assert [stalled is None for stalled, _ in seen] == [True] * 9 + [False]
    assert seen[-1][1] and "dp0 for 5s" in seen[-1][0]
