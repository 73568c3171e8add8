"""200 concurrent streams, a quarter of the clients leaving early: the rest are right, KV is freed, and
every client that left is counted as an abort, exactly once.

The clients that leave ask for far more tokens than the others, so their requests are surely still
running when they hang up: each must then be aborted (request_success_total{finished_reason="abort"}
grows by exactly their number), not run to its end for nobody.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.reliability.conftest import SERVED_NAME

PROMPTS = ["The quick brown fox", "Once upon a time", "Hello, world!", "The capital of France is"]
N_CLIENTS = 200
MAX_TOKENS = 48
LEAVER_MAX_TOKENS = 400


def _body(prompt: str, stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
    return {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }


async def _client(c: httpx.AsyncClient, i: int, leave_early: bool) -> dict:
    prompt = PROMPTS[i % len(PROMPTS)]
    text, chunks, usage, done = [], 0, None, False
    body = _body(prompt, True, LEAVER_MAX_TOKENS if leave_early else MAX_TOKENS)
    async with c.stream("POST", "/v1/completions", json=body) as r:
        status = r.status_code
        if status != 200:
            return {"status": status, "prompt": prompt}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for ch in event.get("choices", []):
                text.append(ch["text"])
            chunks += 1
            if leave_early and chunks >= 3:
                break  # leaving the `async with` closes the connection mid-stream
    return {"status": status, "prompt": prompt, "text": "".join(text), "usage": usage, "done": done}


def _state(server) -> tuple[int, int, int]:
    info = server.server_info()
    ranks = info["internal_states"]
    return (
        info["num_inflight_requests"],
        sum(r["num_running"] + r["num_waiting"] for r in ranks),
        sum(r["kv_pages_used"] for r in ranks),
    )


def _finished(server) -> dict[str, float]:
    """request_success_total by finished_reason."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", headers=server.headers).text
    totals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "tokenspeed:request_success_total":
                reason = s.labels.get("finished_reason", "")
                totals[reason] = totals.get(reason, 0.0) + s.value
    return totals


async def test_concurrent_streams_with_early_disconnects(served):
    server = served
    limits = httpx.Limits(max_connections=N_CLIENTS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=180, limits=limits
    ) as c:
        refs = {}
        for p in PROMPTS:
            r = await c.post("/v1/completions", json=_body(p, False))
            assert r.status_code == 200, r.text
            refs[p] = r.json()["choices"][0]["text"]
        before = _finished(server)
        leave = [i % 4 == 0 for i in range(N_CLIENTS)]
        results = await asyncio.gather(*(_client(c, i, leave[i]) for i in range(N_CLIENTS)))

    assert all(r["status"] == 200 for r in results), {r["status"] for r in results}
    stayed = [r for r, early in zip(results, leave, strict=True) if not early]
    assert len(stayed) == 150
    for r in stayed:
        assert r["done"] and r["usage"]["completion_tokens"] == MAX_TOKENS
        assert r["text"] == refs[r["prompt"]]

    # Every request is gone from the front end and the scheduler, and every KV page is free again.
    deadline = time.monotonic() + 30
    state = _state(server)
    while time.monotonic() < deadline and state != (0, 0, 0):
        await asyncio.sleep(0.2)
        state = _state(server)
    assert state == (0, 0, 0), f"(inflight, scheduled, kv pages used) = {state}"
    # Each client that left was aborted, once; each that stayed ran to its length.
    after = _finished(server)
    grew = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}
    assert grew.get("abort", 0) == N_CLIENTS - len(stayed), grew
    assert grew.get("length", 0) == len(stayed), grew
    assert not grew.get("stop") and not grew.get("error"), grew
