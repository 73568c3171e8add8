"""The supervisor's built-in load generator against real HTTP endpoints: round-robin over the servers it
is given (the READY ones), completions and chat, a concurrency cap, errors counted and never raised, and
nothing left running after stop; then inside a real supervised fleet, where its counts and last error
show in `tokenspeed status` and on the console's fleet screen. (tests/console/test_demo_fleet.py runs it
inside a real demo fleet.)"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from console.supervisor.load import PROMPTS, SHARED_PREFIX, LoadGenerator, LoadSpec, Target

BUSY = Path(__file__).with_name("busy_http.py")
REJECTION = "max_tokens must be at most 8 for this test server"  # what busy_http.py answers with NAME.reject


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
    # Requests still in flight at stop (4 at most) are cancelled: neither ok nor errors.
    assert gen.stats.sent >= 6 and gen.stats.sent - 4 <= gen.stats.errors <= gen.stats.sent
    assert gen.stats.ok == 0
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


# ---------------------------------------------------------------- inside a real fleet

LOAD_LINE = re.compile(r"^load: 20 req/s target, sent (\d+), ok (\d+), errors (\d+)(.*)$", re.M)


def load_fleet(make_fleet):
    """A real supervisor with two busy_http.py servers and a [load] table of 20 requests a second."""
    fleet = make_fleet(replicas=2, command=[sys.executable, str(BUSY)])
    with open(fleet.profile, "a") as f:
        f.write("\n[load]\nrate_per_s = 20\nmax_tokens = 4\nconcurrency = 4\n")
    result = fleet.up()
    assert result.returncode == 0, result.stdout + result.stderr
    return fleet


def status_load(fleet) -> tuple[int, int, int, str]:
    result = fleet.cli("status")
    assert result.returncode == 0, result.stdout + result.stderr
    match = LOAD_LINE.search(result.stdout)
    assert match, f"no load line in `tokenspeed status`:\n{result.stdout}"
    return int(match[1]), int(match[2]), int(match[3]), match[4]


def wait_status(fleet, condition, what: str, timeout: float = 60) -> tuple[int, int, int, str]:
    deadline = time.monotonic() + timeout
    while not condition(seen := status_load(fleet)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: last {seen}"
        time.sleep(0.5)
    return seen


def test_status_shows_the_generators_growing_counts_and_the_servers_own_error(make_fleet):
    fleet = load_fleet(make_fleet)
    sent, ok, errors, rest = wait_status(fleet, lambda s: s[1] >= 5, "5 answered requests")
    assert errors == 0 and "last error" not in rest and ok <= sent
    later = wait_status(fleet, lambda s: s[1] >= ok + 10 and s[0] > sent, "10 more answered requests")
    assert later[2] == 0
    data = json.loads(fleet.cli("status", "--json").stdout)["load"]
    assert data["rate_per_s"] == 20 and data["ok"] >= later[1] and data["sent_per_s"] > 0

    # The servers refuse every request now (HTTP 400 with an OpenAI error body): the counts say so,
    # with the server's own words.
    for i in range(2):
        fleet.flag(fleet.server(i), "reject")
    sent, ok, errors, rest = wait_status(fleet, lambda s: s[2] >= 3, "3 errors")
    assert "(last error: t-" in rest and "HTTP 400 from /v1/" in rest and REJECTION in rest, rest
    data = json.loads(fleet.cli("status", "--json").stdout)["load"]
    assert REJECTION in data["last_error"] and data["last_error_at"] <= time.time()
    assert fleet.cli("status").returncode == 0  # the fleet itself is fine: every server READY


async def test_fleet_screen_shows_the_load_line_and_its_last_error(make_fleet):
    from console.tui.app import ConsoleApp
    from console.tui.live_source import LiveSource
    from tests.console.tui_pilot import text_of, wait_for

    fleet = load_fleet(make_fleet)
    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=(150, 40)) as pilot:

        def counts() -> tuple[int, int, int] | None:
            match = LOAD_LINE.search(text_of(app, "#fleet-load"))
            return (int(match[1]), int(match[2]), int(match[3])) if match else None

        first = await wait_for(pilot, lambda: (c := counts()) and c[1] >= 3 and c, what="a load line")
        assert app.screen.query_one("#fleet-load").display
        # Both counts grow (ok alone may grow first, from requests already in flight at the first look).
        later = await wait_for(
            pilot,
            lambda: (c := counts()) and c[0] > first[0] and c[1] > first[1] and c,
            what="growing counts",
        )
        assert later[2] == 0
        assert "last error" not in text_of(app, "#fleet-load")
        fleet.flag(fleet.server(0), "reject")
        fleet.flag(fleet.server(1), "reject")
        shown = await wait_for(
            pilot,
            lambda: REJECTION in text_of(app, "#fleet-load") and text_of(app, "#fleet-load"),
            what="the error",
        )
        assert "last error" in shown and "HTTP 400" in shown, shown
