"""A real `tokenspeed serve demo --speculative-algorithm NGRAM` answers over HTTP exactly as plain greedy
decoding does (whole and streamed), and exports the spec_decode_* counters and acceptance-length histogram
at /metrics; afterwards no KV page is held."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from console.tui.screens.server import live_text
from tests.server.server_proc import module_server
from tokenspeed import Engine

PROMPT = "To open a file, use the open function. To open a file, use the open function. To open a file,"
MAX_TOKENS = 32


ngram_server = module_server(
    "demo", "spec-logs",
    "--speculative-algorithm", "NGRAM",
    "--speculative-num-draft-tokens", "4",
    "--enable-metrics",
)  # fmt: skip


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"tokenspeed:{name}") and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics")


def test_ngram_server_answers_like_plain_greedy(ngram_server):
    with Engine(model="demo", device="cpu") as plain:
        want = plain.generate(PROMPT, sampling_params={"max_new_tokens": MAX_TOKENS, "temperature": 0.0})
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    url = f"{ngram_server.url}/v1/completions"
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want["text"]
    streamed = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                streamed.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(streamed) == want["text"]
    # /metrics and the rank stats in /get_server_info are each fed by the scheduler's snapshots, which reach
    # the front end a little after the step they describe: read both until they describe the same idle rank.
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(f"{ngram_server.url}/metrics", timeout=10).text
        drafts = _metric(text, "spec_decode_num_drafts_total")
        accepted = _metric(text, "spec_decode_num_accepted_tokens_total")
        info = ngram_server.server_info()
        (rank,) = info["internal_states"]
        settled = (
            drafts > 0
            and rank["num_running"] == 0
            and rank["kv_pages_used"] == 0
            and rank["spec_mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
        )
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    drafted = _metric(text, "spec_decode_num_draft_tokens_total")
    assert drafts > 0 and 0 < accepted <= drafted, text
    assert _metric(text, "spec_decode_acceptance_length_count") > 0
    assert _metric(text, "spec_decode_num_accepted_tokens_per_pos_total") > 0  # position 0, listed first
    assert info["speculative_algorithm"] == "NGRAM"
    assert rank["spec_mean_acceptance_length"] == pytest.approx(1 + accepted / drafts), (rank, text)
    assert rank["kv_pages_used"] == 0 and rank["num_running"] == 0, rank
    # what the console's Server screen shows under "Live state"
    assert f"acceptance length {1 + accepted / drafts:.2f}" in live_text(info)
