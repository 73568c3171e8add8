"""A light built-in load generator, so a demo fleet's graphs move without anyone sending requests.

A profile turns it on with a `[load]` table:

    [load]
    rate_per_s = 0.5        # new requests per second over the whole fleet (Poisson arrivals)
    max_tokens = 48         # tokens asked of each request
    concurrency = 2         # requests in flight at most; an arrival beyond that is skipped, not queued
    chat_fraction = 0.25    # share of /v1/chat/completions (the rest is /v1/completions)
    shared_prefix_fraction = 0.5   # share of prompts that start with one shared preamble (prefix cache hits)

It runs inside the supervisor, on its loop, so `tokenspeed up` without a console shows moving metrics
too. Requests go round-robin to READY servers only; a failed request is counted, never raised; nothing
waits on a request, so the supervisor's 10 Hz tick is never held up. It stops with the fleet. Its counts
and last error (with the server's own words for a refused request) are in the status API
(`LoadGenerator.report`), so `tokenspeed status` and the console's fleet screen show them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from console.ranges import bounded, read_numbers
from console.supervisor.load_report import LoadReport

log = logging.getLogger("tokenspeed.supervisor.load")

# `sent_per_s` in the report covers this much of the recent past.
RATE_WINDOW_S = 60.0

# English prompts on the topics the demo models were trained on (the Python documentation).
PROMPTS = (
    "The Python interpreter",
    "A list is",
    "To open a file,",
    "When an exception is raised",
    "In this tutorial, you will learn",
    "A dictionary maps",
    "The for statement",
    "Regular expressions are",
    "A generator function",
    "The json module",
    "To read a file line by line,",
    "Classes provide a means of",
    "The logging module",
    "A tuple is",
    "The standard library",
    "Decorators are",
)
CHAT_MESSAGES = (
    "What is a dictionary?",
    "How do I read a file?",
    "What does the function json.dumps do?",
    "Tell me about exceptions.",
    "What is a module?",
    "How do I sort a list?",
)
# Sent ahead of some prompts: every server's prefix cache keeps it, so its hit rate is not zero.
SHARED_PREFIX = (
    "The following notes come from the Python documentation. They describe the built-in types, the "
    "statements of the language and the modules of the standard library. Each note starts with what a "
    "feature is for, then shows how to use it, and ends with the details that matter when a program "
    "grows: errors, performance and the differences between versions of Python.\n\n"
)


@dataclass(frozen=True)
class LoadSpec:
    """The `[load]` table: each key's default and the values a profile may give it."""

    rate_per_s: float = bounded(0.5, 0.001, 1000.0)
    max_tokens: int = bounded(48, 1, 100_000)
    concurrency: int = bounded(2, 1, 10_000)
    chat_fraction: float = bounded(0.25, 0.0, 1.0)
    shared_prefix_fraction: float = bounded(0.5, 0.0, 1.0)
    temperature: float = bounded(0.8, 0.0, 10.0)
    timeout_s: float = bounded(120.0, 0.1, 3600.0)
    seed: int = bounded(0, 0, 2**31)


def parse_load(raw) -> LoadSpec | None:
    """The `[load]` table of a raw profile (`console.profile.toml.RawProfile`), checked; None without one."""
    from console.profile.toml import not_a_table

    table = raw.data.get("load")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise raw.error("", "load", not_a_table("load", table))
    return read_numbers(raw, "load", LoadSpec, table)


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    skipped: int = 0  # arrivals dropped because `concurrency` requests were in flight
    completion_tokens: int = 0
    last_error: str = ""
    last_error_at: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)  # the server's API key, when it has one


class LoadGenerator:
    """Poisson arrivals at `rate_per_s`, each a request to the next READY server (`targets()`)."""

    def __init__(self, spec: LoadSpec, targets: Callable[[], list[Target]]):
        self.spec = spec
        self.targets = targets
        self.stats = LoadStats()
        self._random = random.Random(spec.seed)
        self._next = 0
        self._in_flight: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None
        self._started = time.monotonic()
        self._sends: collections.deque[float] = collections.deque()  # send times of the last RATE_WINDOW_S

    def start(self) -> None:
        self._http = httpx.AsyncClient(trust_env=False, timeout=self.spec.timeout_s)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def report(self) -> LoadReport:
        """Counts for the status API: what `tokenspeed status` and the console show."""
        now = time.monotonic()
        self._forget_sends(now)
        window = min(max(now - self._started, 1e-3), RATE_WINDOW_S)
        stats = self.stats
        return LoadReport(
            rate_per_s=self.spec.rate_per_s,
            sent=stats.sent,
            ok=stats.ok,
            errors=stats.errors,
            skipped=stats.skipped,
            sent_per_s=round(len(self._sends) / window, 3),
            last_error=stats.last_error or None,
            last_error_at=stats.last_error_at,
        )

    def _forget_sends(self, now: float) -> None:
        while self._sends and now - self._sends[0] > RATE_WINDOW_S:
            self._sends.popleft()

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._http is not None:
            await self._http.aclose()
        log.info("load generator stopped: %s", self.stats.to_dict())

    async def _run(self) -> None:
        log.info("load generator: %s", self.spec)
        next_report = time.monotonic() + 60.0
        while True:
            await asyncio.sleep(self._random.expovariate(self.spec.rate_per_s))
            self.arrival()
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + 60.0
                log.info("load: %s", self.stats.to_dict())

    def arrival(self) -> None:
        """One arrival: start a request to the next READY server, or count it skipped."""
        targets = self.targets()
        if not targets:
            return
        if len(self._in_flight) >= self.spec.concurrency:
            self.stats.skipped += 1
            return
        target = targets[self._next % len(targets)]
        self._next += 1
        task = asyncio.get_running_loop().create_task(self._send(target))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def request(self) -> tuple[str, dict]:
        """The next request's path and JSON body."""
        spec, pick = self.spec, self._random
        prefix = SHARED_PREFIX if pick.random() < spec.shared_prefix_fraction else ""
        body: dict = {"max_tokens": spec.max_tokens, "temperature": spec.temperature}
        if pick.random() < spec.chat_fraction:
            messages = [{"role": "user", "content": prefix + pick.choice(CHAT_MESSAGES)}]
            return "/v1/chat/completions", {**body, "messages": messages}
        return "/v1/completions", {**body, "prompt": prefix + pick.choice(PROMPTS)}

    async def _send(self, target: Target) -> None:
        if self._http is None:  # stopped
            return
        path, body = self.request()
        self.stats.sent += 1
        now = time.monotonic()
        self._sends.append(now)
        self._forget_sends(now)
        try:
            response = await self._http.post(target.url + path, json=body, headers=target.headers)
            if response.is_error:
                self._error(target, f"HTTP {response.status_code} from {path}: {_error_text(response)}")
                return
            usage = response.json().get("usage") or {}
            self.stats.completion_tokens += int(usage.get("completion_tokens") or 0)
            self.stats.ok += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a server going down mid-request is expected in a fleet; count it
            self._error(target, f"{type(exc).__name__}: {exc}")

    def _error(self, target: Target, text: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{target.name}: {text}"[:300]
        self.stats.last_error_at = time.time()


def _error_text(response: httpx.Response) -> str:
    """What the server said was wrong: the OpenAI-style `error.message`, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or body.get("detail") or body.get("message")
        if message:
            return str(message)
    return response.text.strip()[:200] or response.reason_phrase


def for_supervisor(sup) -> LoadGenerator | None:
    """The generator of a supervisor's profile `[load]` table (None without one), aimed at READY servers."""
    from console.profile.toml import read_profile
    from console.supervisor.states import State

    spec = parse_load(read_profile(sup.resolved.profile.path))
    if spec is None:
        return None

    def targets() -> list[Target]:
        if sup.shutting_down:
            return []
        ready = [u for u in sup.units.values() if u.state == State.READY]
        return [Target(u.spec.name, u.spec.url, sup.auth[u.spec.name]) for u in ready]

    return LoadGenerator(spec, targets)
