"""Start-up variants and draining on one server: --skip-tokenizer-init, --stream-interval with
--stream-output, --warmups, and SIGTERM letting an in-flight request finish before exiting 0.
(Killed processes are covered in test_data_parallel.py, on servers with a controller and two ranks.)"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import psutil
import pytest

from tests.server.server_proc import launch


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    s = launch(
        tiny_model,
        tmp_path_factory.mktemp("lifecycle-logs"),
        "--skip-tokenizer-init", "--warmups", "batch,long_prompt", "--stream-interval", "4", "--stream-output",
        "--enable-metrics",
        env={"TOKENSPEED_DRAIN_TIMEOUT": "20"},
    )  # fmt: skip
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop(signal.SIGKILL, timeout=10)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_warmups_ran(srv):
    log = srv.log()
    assert "warm-up basic" in log and "warm-up batch" in log and "warm-up long_prompt" in log


def _phases(text: str) -> dict[str, float]:
    return {name: float(s) for name, s in re.findall(r"([A-Za-z][\w -]*?) ([\d.]+) s(?:,|$)", text)}


def test_start_up_says_where_its_seconds_went(srv):
    # An operator waiting on a start reads which phase took the time (on the H200 once: 102 s compiling the
    # sampler's kernels) from the scheduler's ready line, the front end's from its own line, and the whole
    # start from the READY line.
    log = srv.log()
    ready = re.search(r"scheduler dp0 tp0 ready \(1/1\) after ([\d.]+) s: (.*)", log)
    assert ready, log[-3000:]
    phases = _phases(ready.group(2))
    scheduler_total = float(ready.group(1))
    assert list(phases)[:3] == ["process start and imports", "device init", "model config"], phases
    for named in ("model and weights", "KV cache sizing", "KV cache", "scheduler", "tokenizer and grammar"):
        assert named in phases, phases
    assert list(phases)[-1] == "other"
    assert abs(sum(phases.values()) - scheduler_total) < 0.5
    # Every second has a name: what none covers is a small rest (it was 4.1 s of 9.9 s here).
    assert phases["other"] <= max(0.1 * scheduler_total, 0.2), phases

    total = re.search(r"the server is ready on \S+ \(\d+ child processes\), ([\d.]+) s after it started", log)
    assert total and float(total.group(1)) >= scheduler_total, log[-3000:]
    front = re.search(r"front end start-up: (.*)", log)
    assert front, log[-3000:]
    front_phases = _phases(front.group(1))
    assert list(front_phases)[:3] == [
        "process start and imports",
        "flags and checks",
        "starting the schedulers",
    ]
    assert "tokenizer" in front_phases and "warm-up" in front_phases and list(front_phases)[-1] == "other"
    assert abs(sum(front_phases.values()) - float(total.group(1))) < 0.5, (front_phases, total.group(1))
    assert front_phases["other"] <= max(0.1 * float(total.group(1)), 0.2), front_phases
    # The schedulers started before the front end's own set-up (imports, tokenizer, HTTP app), so it waited
    # for them only for what that set-up did not cover.
    order = list(front_phases)
    assert (
        order.index("starting the schedulers")
        < order.index("tokenizer")
        < order.index("waiting for the schedulers")
    )
    overlapped = (
        front_phases["front end imports"] + front_phases["tokenizer"] + front_phases["front end set-up"]
    )
    assert front_phases["waiting for the schedulers"] < scheduler_total - 0.5 * overlapped, front_phases


def test_startup_log_reads_this_servers_start_up(srv):
    from benchmarks.startup_log import phase_lines

    lines = phase_lines(srv.log())
    text = "\n".join(lines)
    assert "started 1 child process" in lines[0] and lines[0].startswith("+   0.0 s"), text
    assert "the server is ready on" in lines[-1], text
    assert re.search(r"scheduler dp0 tp0 ready \(1/1\) after [\d.]+ s: .*, other [\d.]+ s$", text, re.M), text
    assert re.search(r"front end start-up: .*, other [\d.]+ s$", text, re.M), text


def test_skip_tokenizer_init_serves_token_ids(srv):
    r = httpx.post(f"{srv.url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4,
                   "ignore_eos": True}})  # fmt: skip
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 4 and r.json()["text"] == ""
    r = httpx.post(f"{srv.url}/generate", json={"text": "hello"})
    assert r.status_code == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"]


def test_stream_interval_batches_stream_chunks(srv):
    with httpx.stream("POST", f"{srv.url}/generate", timeout=60, json={"input_ids": [1, 5, 9], "stream": True,
                      "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}) as r:  # fmt: skip
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    # --stream-output: each event carries only its new ids; --stream-interval 4: four at a time. Outputs
    # that reach the HTTP layer together are sent as one event, so a slow reader may see 8 at once.
    sizes = [len(e["output_ids"]) for e in events]
    assert sum(sizes) == 12 and all(n % 4 == 0 for n in sizes), sizes


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_count_answers_by_status_and_scheduler_steps(srv):
    def page() -> str:
        return httpx.get(f"{srv.url}/metrics", timeout=10).text

    before = page()
    steps = _metric(before, "tokenspeed:scheduler_steps_total")
    refused = _metric(before, "tokenspeed:http_responses_total", status="400")
    ok = _metric(before, "tokenspeed:http_responses_total", status="200")
    assert httpx.post(f"{srv.url}/generate", json={"text": "no tokenizer"}).status_code == 400
    r = httpx.post(f"{srv.url}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3,
                   "ignore_eos": True}}, timeout=60)  # fmt: skip
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while _metric(page(), "tokenspeed:scheduler_steps_total") < steps + 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # the scheduler reports its steps about every 0.1 s
    after = page()
    assert _metric(after, "tokenspeed:scheduler_steps_total") >= steps + 3  # one step per generated token
    assert _metric(after, "tokenspeed:http_responses_total", status="400") == refused + 1
    # /metrics and /health answers are not counted: only the one generation's 200.
    assert _metric(after, "tokenspeed:http_responses_total", status="200") == ok + 1


def test_sigterm_drains_in_flight_requests_then_exits_zero(srv):
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    result: dict = {}

    def long_request():
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            r = c.post("/generate", json={"input_ids": [1, 7, 8], "sampling_params": {"max_new_tokens": 120,
                       "ignore_eos": True}})  # fmt: skip
            result["status"], result["body"] = r.status_code, r.json()

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and srv.server_info()["num_inflight_requests"] == 0:
        time.sleep(0.02)
    # SIGTERM to the whole process group, as the supervisor stops a server (and as Ctrl-C in a terminal
    # reaches every process): the schedulers must keep serving until the main process has drained.
    os.killpg(os.getpgid(srv.proc.pid), signal.SIGTERM)
    # While draining, new work is refused with 503 (once the listener closes there is no answer at all).
    time.sleep(0.2)
    try:
        r = httpx.post(f"{srv.url}/generate", json={"input_ids": [1]}, timeout=5)
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
        assert r.headers["retry-after"] == "2"  # clients back off, then retry (elsewhere)
        assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 503
    except httpx.TransportError:
        pass
    t.join(timeout=60)
    assert result["status"] == 200, json.dumps(result)
    assert result["body"]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(result["body"]["output_ids"]) == 120
    assert srv.proc.wait(timeout=30) == 0
    gone, still = psutil.wait_procs(children, timeout=10)
    assert not alive(still)
