"""The supervisor's built-in load generator against real HTTP endpoints: round-robin over the servers it
is given (the READY ones), completions and chat, a concurrency cap, errors counted and never raised, and
nothing left running after stop. (tests/console/test_demo_fleet.py runs it inside a real demo fleet.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from console.supervisor.load import PROMPTS, SHARED_PREFIX, LoadGenerator, LoadSpec, Target


class Recorder:
    """An OpenAI-style endpoint that records what it gets and answers after `delay_s` (or with `status`)."""

    def __init__(self, delay_s: float = 0.0, status: int = 200):
        self.requests: list[tuple[str, dict]] = []
        self.delay_s, self.status = delay_s, status
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.requests.append((self.path, body))
                time.sleep(recorder.delay_s)
                payload = json.dumps({"usage": {"completion_tokens": body["max_tokens"]}}).encode()
                try:
                    self.send_response(recorder.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped waiting
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoints():
    made: list[Recorder] = []

    def make(**kwargs) -> Recorder:
        made.append(Recorder(**kwargs))
        return made[-1]

    yield make
    for recorder in made:
        recorder.close()


async def run_for(gen: LoadGenerator, seconds: float) -> None:
    gen.start()
    await asyncio.sleep(seconds)
    await gen.stop()


def test_round_robin_over_ready_servers_with_completions_chat_and_a_shared_prefix(endpoints):
    a, b, down = endpoints(), endpoints(), endpoints()
    ready = [Target("a", a.url), Target("b", b.url)]  # `down` is not READY: it must get nothing
    spec = LoadSpec(rate_per_s=40, max_tokens=7, concurrency=8, chat_fraction=0.5, shared_prefix_fraction=0.5)
    gen = LoadGenerator(spec, lambda: ready)
    asyncio.run(run_for(gen, 1.5))
    assert not down.requests
    assert len(a.requests) >= 10 and abs(len(a.requests) - len(b.requests)) <= 3
    everything = a.requests + b.requests
    paths = {path for path, _ in everything}
    assert paths == {"/v1/completions", "/v1/chat/completions"}
    prompts = [body.get("prompt") or body["messages"][0]["content"] for _, body in everything]
    shared = sum(p.startswith(SHARED_PREFIX) for p in prompts)
    assert 0 < shared < len(prompts)
    assert any(p.removeprefix(SHARED_PREFIX) in PROMPTS for p in prompts)
    assert all(body["max_tokens"] == 7 for _, body in everything)
    stats = gen.stats
    # Requests still in flight at stop are cancelled: neither ok nor errors.
    assert stats.errors == 0 and stats.ok <= len(everything) <= stats.sent and stats.ok >= stats.sent - 8
    assert stats.completion_tokens == 7 * stats.ok


def test_no_ready_server_sends_nothing_and_a_full_pipe_skips_arrivals(endpoints):
    idle = LoadGenerator(LoadSpec(rate_per_s=50), lambda: [])
    asyncio.run(run_for(idle, 0.5))
    assert idle.stats.sent == 0 and idle.stats.skipped == 0

    slow = endpoints(delay_s=2.0)
    gen = LoadGenerator(LoadSpec(rate_per_s=50, concurrency=2), lambda: [Target("slow", slow.url)])
    started = time.monotonic()
    asyncio.run(run_for(gen, 0.8))
    # Two requests in flight at most; arrivals beyond that are dropped; stop does not wait for them.
    assert len(slow.requests) == 2 and gen.stats.sent == 2
    assert gen.stats.skipped >= 10 and gen.stats.ok == 0
    assert time.monotonic() - started < 1.8


def test_errors_are_counted_not_raised(endpoints):
    failing = endpoints(status=500)
    closed = Target("gone", "http://127.0.0.1:9")  # nothing listens there
    gen = LoadGenerator(
        LoadSpec(rate_per_s=30, concurrency=4, timeout_s=2),
        lambda: [Target("fail", failing.url), closed],
    )
    asyncio.run(run_for(gen, 1.0))
    assert gen.stats.sent >= 6 and gen.stats.errors == gen.stats.sent and gen.stats.ok == 0
    assert failing.requests and ("fail:" in gen.stats.last_error or "gone:" in gen.stats.last_error)


def test_the_loop_is_never_blocked(endpoints):
    """A tick that runs beside the generator keeps its pace while requests are slow."""
    slow = endpoints(delay_s=1.0)

    async def scenario() -> float:
        gen = LoadGenerator(LoadSpec(rate_per_s=50, concurrency=4), lambda: [Target("s", slow.url)])
        gen.start()
        worst, last = 0.0, time.monotonic()
        for _ in range(20):
            await asyncio.sleep(0.05)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        await gen.stop()
        return worst

    assert asyncio.run(scenario()) < 0.5  # a blocking request would hold it for 1 s
