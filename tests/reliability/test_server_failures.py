"""A request the server cuts short is an error to its client, never an answer that looks complete.

Seen before: after kill -9 of the scheduler, every stream ended with finish_reason "stop" and [DONE]
and a non-streaming request got HTTP 200 with "stop"; requests cut off by the drain timeout looked the
same. Here the official `openai` client (and /generate) must see an error from every request in flight,
a streaming one after a last choice that says "error" or "abort", and no choice may say "stop".
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import httpx
import openai
import pytest

from tests.reliability.conftest import DRAIN_TIMEOUT_S, SERVED_NAME, inflight

# Long enough to be cut off: far more tokens than the test takes to kill the server.
LONG = {"max_tokens": 3000, "extra_body": {"ignore_eos": True}}
N_STREAMS = 4


async def _openai_stream(client: openai.AsyncOpenAI, chat: bool) -> dict:
    chunks, reasons = 0, []
    try:
        if chat:
            stream = await client.chat.completions.create(
                model=SERVED_NAME, messages=[{"role": "user", "content": "Tell a story"}], stream=True, **LONG
            )
        else:
            stream = await client.completions.create(
                model=SERVED_NAME, prompt="Once upon", stream=True, **LONG
            )
        async for chunk in stream:
            chunks += 1
            reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
    except openai.APIError as exc:
        return {"chunks": chunks, "reasons": reasons, "error": exc.message, "body": exc.body}
    return {"chunks": chunks, "reasons": reasons, "error": None}


async def _openai_single(client: openai.AsyncOpenAI, chat: bool) -> dict:
    try:
        if chat:
            r = await client.chat.completions.create(
                model=SERVED_NAME, messages=[{"role": "user", "content": "Tell a story"}], **LONG
            )
        else:
            r = await client.completions.create(model=SERVED_NAME, prompt="Once upon", **LONG)
    except openai.APIStatusError as exc:
        return {"status": exc.status_code, "error": exc.message, "body": exc.body}
    return {"status": 200, "reasons": [c.finish_reason for c in r.choices], "error": None}


async def _native(url: str, stream: bool) -> dict:
    body = {
        "text": "Once upon",
        "stream": stream,
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        if not stream:
            r = await c.post("/generate", json=body)
            return {"status": r.status_code, "body": r.json()}
        events = []
        async with c.stream("POST", "/generate", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
        return {"status": r.status_code, "events": events}


async def _cut_off_everything(srv, cut) -> list[dict]:
    """Start streaming and non-streaming requests of every kind, `cut()` the server once each stream is
    under way, and collect what every client saw."""
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=60)
    tasks = [asyncio.ensure_future(_openai_stream(client, chat=i % 2 == 1)) for i in range(N_STREAMS)]
    tasks += [asyncio.ensure_future(_openai_single(client, chat=c)) for c in (False, True)]
    tasks += [asyncio.ensure_future(_native(srv.url, stream=s)) for s in (True, False)]
    deadline = time.monotonic() + 60
    while inflight(srv) < len(tasks) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # a few tokens into each
    cut()
    return await asyncio.gather(*tasks)


def _check_everyone_saw_an_error(results: list[dict], status: int, reason: str, cause: str) -> None:
    streams, singles, (native_stream, native_single) = (
        results[:N_STREAMS],
        results[N_STREAMS:-2],
        results[-2:],
    )
    for r in streams:
        assert r["error"] is not None, f"a stream ended without an error: {r}"
        assert cause in r["error"], r
        assert r["reasons"] == [reason], r  # its last choice says why, and nothing said "stop"
    for r in singles:
        assert r["status"] == status, r
        assert cause in r["error"], r
    assert native_single["status"] == status, native_single
    assert cause in native_single["body"]["error"]["message"]
    last = native_stream["events"][-2]
    assert last["meta_info"]["finish_reason"]["type"] == reason, last
    assert native_stream["events"][-1]["error"]["code"], native_stream["events"][-1]


def _finish_reasons_logged(srv) -> list[str]:
    return re.findall(r"request_stats rid=\S+ .* finish_reason=(\w+)", srv.log())


@pytest.fixture(scope="module")
def crashing(servers):
    return servers["crashing"]


@pytest.fixture(scope="module")
def draining(servers):
    return servers["draining"]


def test_a_killed_scheduler_is_an_error_to_every_client(crashing):
    scheduler = next(iter(crashing.server_info()["child_pids"].values()))
    results = asyncio.run(_cut_off_everything(crashing, lambda: os.kill(scheduler, signal.SIGKILL)))
    _check_everyone_saw_an_error(results, 500, "error", "exited with code -9")
    assert crashing.proc.wait(timeout=30) == 1
    # The same finish reason feeds request_success_total{finished_reason}: every cut request is an error.
    logged = _finish_reasons_logged(crashing)
    assert logged[-len(results) :] == ["error"] * len(results), logged


def test_the_drain_timeout_is_an_error_to_every_client(draining):
    results = asyncio.run(_cut_off_everything(draining, lambda: os.kill(draining.proc.pid, signal.SIGTERM)))
    _check_everyone_saw_an_error(results, 503, "abort", "TOKENSPEED_DRAIN_TIMEOUT")
    assert draining.proc.wait(timeout=30) == 0
    logged = _finish_reasons_logged(draining)
    assert logged[-len(results) :] == ["abort"] * len(results), logged
    assert f"after {DRAIN_TIMEOUT_S:g} s" in draining.log()
