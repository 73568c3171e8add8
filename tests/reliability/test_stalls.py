"""One large request stalls no one.

Seen before: a 10 MB prompt was refused only after 8.5 s (it was tokenized on the event loop before any
length check); meanwhile /health took 5.7 s and another client's stream paused 8.5 s. Now a body over
--max-request-bytes is answered 413 before it is read, text longer than the context can hold is refused
before it is tokenized, and tokenizing runs off the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from tests.reliability.conftest import SERVED_NAME, wait_idle
from tests.server.timed_stream import TimedStream

# Bounds generous enough for a loaded two-core machine, far below what the stall used to cost.
ANSWER_WITHIN_S = 3.0
HEALTH_WITHIN_S = 1.0
MAX_GAP_S = 1.5


def test_huge_prompts_are_refused_at_once_and_stall_no_one(served):
    stream = TimedStream(served, SERVED_NAME)
    stream.start()
    assert stream.started.wait(60)
    limit = served.server_info()["max_request_bytes"]
    ten_mb = {"model": SERVED_NAME, "prompt": "word " * 2_000_000, "max_tokens": 4}
    under_limit = {"model": SERVED_NAME, "prompt": "word " * ((limit - 1000) // 5), "max_tokens": 4}
    timings, health = [], []

    def health_probe(stop: threading.Event) -> None:
        while not stop.is_set():
            t = time.monotonic()
            httpx.get(f"{served.url}/health", timeout=30)
            health.append(time.monotonic() - t)
            time.sleep(0.05)

    stop = threading.Event()
    prober = threading.Thread(target=health_probe, args=(stop,), daemon=True)
    since = time.monotonic()
    prober.start()
    with httpx.Client(base_url=served.url, headers=served.headers, timeout=60) as c:
        for body, status, code in (
            (ten_mb, 413, "request_too_large"),
            (under_limit, 400, "context_length_exceeded"),
        ):
            t = time.monotonic()
            r = c.post("/v1/completions", json=body)
            timings.append(time.monotonic() - t)
            assert r.status_code == status, r.text[:300]
            assert r.json()["error"]["code"] == code
    until = time.monotonic()
    stop.set()
    prober.join(timeout=30)
    stream.join(timeout=120)

    assert max(timings) < ANSWER_WITHIN_S, timings
    assert health and max(health) < HEALTH_WITHIN_S, health
    gap = stream.longest_gap(since, until)
    assert gap < MAX_GAP_S, f"the stream paused {gap:.2f} s while the large prompts were refused"
    assert wait_idle(served) == 0


def test_tokenizing_a_long_prompt_leaves_the_event_loop_free(reliability_model):
    """Below the context bound a prompt is tokenized for real; the loop goes on meanwhile."""
    from tokenspeed.runtime.engine.prompt_encoder import PromptEncoder
    from tokenspeed.runtime.engine.tokenizer import load_tokenizer

    encoder = PromptEncoder(load_tokenizer(reliability_model))
    text = "the quick brown fox jumps over the lazy dog " * 20_000  # no context bound set: tokenized
    started = time.monotonic()
    encoder.tokenizer.encode(text)
    inline_s = time.monotonic() - started

    async def measure() -> float:
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.02)
        ids = await encoder.encode(text)
        ticker.cancel()
        assert len(ids) > 50_000
        return max(gaps)

    try:
        longest = asyncio.run(measure())
    finally:
        encoder.close()
    assert longest < max(0.1, inline_s / 3), (
        f"the loop stalled {longest:.3f} s (tokenizing takes {inline_s:.3f} s)"
    )
