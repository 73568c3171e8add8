"""A long streamed completion whose chunk arrival times are recorded: how the stall and admission tests
see whether other work paused a running stream."""

from __future__ import annotations

import threading
import time

import httpx


class TimedStream(threading.Thread):
    """Streams 400 tokens of `model` from the server `srv` (its .url and .headers) in the background."""

    def __init__(self, srv, model: str) -> None:
        super().__init__(daemon=True)
        self.srv, self.model, self.times, self.started = srv, model, [], threading.Event()

    def run(self) -> None:
        body = {"model": self.model, "prompt": "Once", "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=self.srv.url, headers=self.srv.headers, timeout=120) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.times.append(time.monotonic())
                        self.started.set()

    def longest_gap(self, since: float, until: float) -> float:
        """The longest gap between chunks that overlaps [since, until] (when other requests were answered)."""
        pairs = zip(self.times, self.times[1:], strict=False)
        return max((b - a for a, b in pairs if b >= since and a <= until), default=0.0)
