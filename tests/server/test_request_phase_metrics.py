"""The request-phase histograms (queue, prefill, decode, inference) and the per-request token histograms,
from a real server that runs one sequence at a time, so concurrent requests wait behind each other."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_proc import ServerProc, served

SERVED = "phases"
LABELS = {"model_name": SERVED, "dp_rank": "0"}
PHASES = ("queue", "prefill", "decode", "inference")
NEW = ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
       "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens")  # fmt: skip


@pytest.fixture(scope="module")
def one_seq_server(tiny_model, tmp_path_factory) -> ServerProc:
    with served(
        tiny_model, tmp_path_factory.mktemp("phase-logs"),
        "--served-model-name", SERVED, "--enable-metrics", "--max-num-seqs", "1",
    ) as srv:  # fmt: skip
        yield srv


def scrape(srv: ServerProc) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if all(s.labels.get(k) == v for k, v in LABELS.items()):
                out[(s.name, s.labels.get("le", ""))] = s.value
    return out


def delta(after: dict, before: dict, name: str, le: str = "") -> float:
    return after[(f"tokenspeed:{name}", le)] - before.get((f"tokenspeed:{name}", le), 0.0)


def generate(srv: ServerProc, start: int, n_prompt: int, n_new: int) -> dict:
    body = {"input_ids": list(range(start, start + n_prompt)),
            "sampling_params": {"max_new_tokens": n_new, "ignore_eos": True, "temperature": 0}}  # fmt: skip
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def phase_sums(after: dict, before: dict) -> dict[str, float]:
    return {p: delta(after, before, f"request_{p}_time_seconds_sum") for p in PHASES}


def test_histograms_exist_per_finished_request(one_seq_server):
    # Created at zero with the rank; by now only the start-up warm-up request has finished.
    s = scrape(one_seq_server)
    finished = s[("tokenspeed:e2e_request_latency_seconds_count", "")]
    for name in NEW:
        assert s[(f"tokenspeed:{name}_count", "")] == finished, name
        assert (f"tokenspeed:{name}_bucket", "+Inf") in s, name


def test_phases_count_every_request_and_add_up_to_e2e(one_seq_server):
    srv = one_seq_server
    before = scrape(srv)
    prompts = [(5, 17), (40, 9), (80, 30)]
    for start, n in prompts:
        generate(srv, start, n, 12)
    after = scrape(srv)
    n_req = len(prompts)
    assert delta(after, before, "e2e_request_latency_seconds_count") == n_req
    for name in NEW:
        assert delta(after, before, f"{name}_count") == n_req, name
    sums = phase_sums(after, before)
    e2e = delta(after, before, "e2e_request_latency_seconds_sum")
    ttft = delta(after, before, "time_to_first_token_seconds_sum")
    assert all(v > 0 for v in sums.values()), sums
    assert sums["queue"] + sums["inference"] == pytest.approx(e2e, rel=1e-6, abs=1e-6)
    assert sums["prefill"] + sums["decode"] == pytest.approx(sums["inference"], rel=1e-6, abs=1e-6)
    assert sums["queue"] + sums["prefill"] == pytest.approx(ttft, rel=1e-6, abs=1e-6)
    assert delta(after, before, "request_prompt_tokens_sum") == sum(n for _, n in prompts)
    assert delta(after, before, "request_prompt_tokens_sum") == delta(after, before, "prompt_tokens_total")
    assert delta(after, before, "request_generation_tokens_sum") == 12 * n_req


def test_a_request_that_waits_behind_others_has_a_longer_queue_time(one_seq_server):
    srv = one_seq_server
    before = scrape(srv)
    lone = generate(srv, 7, 8, 4)  # alone on an idle server: scheduled at once
    alone = scrape(srv)
    first_queue = delta(alone, before, "request_queue_time_seconds_sum")
    # meta_info reports the same queue time as the histogram (both from the same two timestamps).
    assert lone["meta_info"]["queue_time"] == pytest.approx(first_queue, abs=1e-6)
    # With --max-num-seqs 1, of several requests sent together all but one wait for a whole request before
    # their first batch.
    n_req, n_new = 3, 128
    with ThreadPoolExecutor(n_req) as pool:
        outs = list(pool.map(lambda i: generate(srv, 20 + 30 * i, 8, n_new), range(n_req)))
    assert all(len(o["output_ids"]) == n_new for o in outs)
    queued = sorted(o["meta_info"]["queue_time"] for o in outs)
    assert queued[-1] > first_queue, (queued, first_queue)
    after = scrape(srv)
    assert delta(after, alone, "request_queue_time_seconds_count") == n_req
    # The smallest bucket that holds the lone request's queue time: some concurrent request is above it.
    bounds = sorted({float(le) for (name, le) in after if name.endswith("queue_time_seconds_bucket")})
    le = next(b for b in bounds if b >= first_queue)
    le_label = "+Inf" if le == float("inf") else str(le)
    within = delta(after, alone, "request_queue_time_seconds_bucket", le_label)
    assert within < n_req, (
        f"every queued request waited at most {le_label} s, like the lone one ({first_queue})"
    )
    waited = delta(after, alone, "request_queue_time_seconds_sum")
    assert waited == pytest.approx(sum(queued), abs=1e-5)
    assert waited > first_queue, (waited, first_queue)
    # Whoever waited did so for at least one other request's decode.
    decode_sum = delta(after, alone, "request_decode_time_seconds_sum")
    assert waited >= decode_sum / n_req, (waited, decode_sum)
