"""/generate (SGLang's shape), health and info routes, admin routes, errors and /metrics, over httpx."""

from __future__ import annotations

import importlib.metadata
import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import SERVED_NAME


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        yield c


def sse_events(lines) -> list[dict]:
    events = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: ") :]))
    return events


def metric_values(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(values: dict, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum(v for (n, lab), v in values.items() if n == name and set(labels.items()) <= set(lab))


def test_generate_text(http):
    r = http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                            "ignore_eos": True}})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["output_ids"]) == 6
    assert isinstance(body["text"], str)
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] > 0


def test_generate_input_ids_batch_and_greedy_consistency(http):
    single = http.post("/generate", json={"input_ids": [1, 20, 30, 40], "sampling_params": {"max_new_tokens": 5,
                                          "temperature": 0, "ignore_eos": True}}).json()  # fmt: skip
    batch = http.post(
        "/generate",
        json={
            "input_ids": [[1, 20, 30, 40], [1, 50, 60]],
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
        },
    ).json()
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == single["output_ids"]


def test_generate_stream(http):
    with http.stream(
        "POST",
        "/generate",
        json={
            "text": "Once upon",
            "stream": True,
            # Enough tokens that generation outlasts a scheduling hiccup of the front end: deltas that pile
            # up while the handler waits are sent together, so a very short stream may be one event.
            "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True},
        },  # fmt: skip
    ) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"
    events = sse_events(lines)
    assert len(events) >= 2
    # Cumulative text and ids; only the last event carries a finish reason.
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert len(events[-1]["output_ids"]) == 64
    assert all(events[-1]["text"].startswith(e["text"]) for e in events)


def test_stop_string_reported_in_meta_info(http):
    ref = http.post("/generate", json={"text": "The capital", "sampling_params": {"max_new_tokens": 20,
                    "temperature": 0, "ignore_eos": True}}).json()  # fmt: skip
    text = ref["text"]
    stop = next(text[i : i + 2] for i in range(2, len(text) - 2) if text[i : i + 2].strip())
    r = http.post("/generate", json={"text": "The capital", "sampling_params": {"max_new_tokens": 20,
                  "temperature": 0, "ignore_eos": True, "stop": [stop]}}).json()  # fmt: skip
    assert r["text"] == text[: text.index(stop)]
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"text": "hi", "sampling_params": {"max_new_tokens": 2, "bogus": 1}}, "bogus"),
        ({"text": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
        ({"text": "hi", "input_ids": [1]}, "exactly one"),
        ({"input_ids": [1, 10**9]}, "vocab"),
        ({"input_ids": []}, "input_ids"),
    ],
)
def test_generate_bad_requests_are_400(http, body, fragment):
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error"


def test_invalid_json_and_unknown_route(http):
    r = http.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = http.get("/no/such/route")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_health_and_info(http, server):
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/health_generate").status_code == 200
    info = http.get("/get_model_info").json()
    assert info["served_model_name"] == SERVED_NAME and info["is_generation"] is True
    assert info["preferred_sampling_params"] == {"top_k": 50}
    sinfo = http.get("/get_server_info").json()
    assert sinfo["status"] == "ready" and sinfo["served_model_name"] == SERVED_NAME
    assert "api_key" not in sinfo
    assert sinfo["internal_states"][0]["kv_pages_total"] > 0
    assert list(sinfo["child_pids"]) == ["scheduler dp0 tp0"]
    assert http.get("/version").json() == {"version": importlib.metadata.version("tokenspeed")}
    # --enable-log-request-stats: one line per finished request.
    assert "request_stats rid=" in server.log()
    # --enable-log-requests --log-requests-level 1: arrivals with their sampling parameters.
    assert "request rid=" in server.log() and "sampling={" in server.log()


def test_abort_request_ends_a_running_stream(http):
    got: list[str] = []

    def consume():
        with httpx.Client(base_url=str(http.base_url), headers=http.headers, timeout=60) as c:
            with c.stream("POST", "/generate", json={"text": "abort me", "rid": "abort-me", "stream": True,
                          "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}) as r:  # fmt: skip
                got.extend(r.iter_lines())

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not got:  # wait until tokens flow
        time.sleep(0.02)
    r = http.post("/abort_request", json={"rid": "abort-me"})
    assert r.status_code == 200
    t.join(timeout=30)
    events = sse_events(got)
    assert events and events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(events[-1]["output_ids"]) < 400


def test_flush_cache_and_expert_routes(http):
    assert http.post("/flush_cache").status_code == 200
    r = http.post("/start_expert_distribution_record")
    assert r.status_code == 400
    assert "not enabled" in r.json()["error"]["message"]


def test_metrics_parse_and_move(http):
    before = metric_values(http.get("/metrics").text)
    labels = {"model_name": SERVED_NAME, "dp_rank": "0"}
    assert metric(before, "tokenspeed:kv_cache_total_tokens", **labels) > 0
    r = http.post("/generate", json={"input_ids": [1, 2, 3, 4, 5, 6, 7], "sampling_params": {"max_new_tokens": 9,
                  "ignore_eos": True}})  # fmt: skip
    assert r.status_code == 200
    time.sleep(0.5)  # schedulers send stats every 0.1 s
    after = metric_values(http.get("/metrics").text)
    assert (
        metric(after, "tokenspeed:prompt_tokens_total", **labels)
        - metric(before, "tokenspeed:prompt_tokens_total", **labels)
        == 7
    )
    assert (
        metric(after, "tokenspeed:generation_tokens_total", **labels)
        - metric(before, "tokenspeed:generation_tokens_total", **labels)
        == 9
    )
    for name in ("tokenspeed:e2e_request_latency_seconds_count", "tokenspeed:time_to_first_token_seconds_count",
                 "tokenspeed:iteration_tokens_total_count", "tokenspeed:prefix_cache_queries_total"):  # fmt: skip
        assert metric(after, name, **labels) > metric(before, name, **labels), name
    assert (
        metric(after, "tokenspeed:inter_token_latency_seconds_count", **labels)
        - metric(before, "tokenspeed:inter_token_latency_seconds_count", **labels)
        == 8
    )
    assert metric(after, "tokenspeed:request_success_total", finished_reason="length", **labels) > 0
    assert metric(after, "tokenspeed:num_requests_running", **labels) == 0
    # Every name the console reads is exported.
    assert not [n for n, _ in after if n.endswith("_created")]
    names = {n for n, _ in after}
    for required in ("num_requests_waiting", "num_preemptions_total", "gen_throughput", "kv_cache_usage_perc",
                     "kv_cache_used_tokens", "prefix_cache_hits_total", "num_requests_total"):  # fmt: skip
        assert f"tokenspeed:{required}" in names, required
