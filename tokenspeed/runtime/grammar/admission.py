"""Requests whose grammar is still compiling, held back from the scheduler until it is ready.

A scheduler process compiles in the backend's thread pool while it keeps stepping the other requests;
a request joins the scheduler with its GrammarState once its compile is done (at once for a cached one).
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass

from tokenspeed.runtime.grammar.backend import GrammarBackend, GrammarError
from tokenspeed.runtime.scheduler.request import Request


@dataclass
class _Pending:
    req: Request
    kind: str
    text: str
    future: concurrent.futures.Future
    deadline: float


class GrammarAdmission:
    def __init__(self, backend: GrammarBackend) -> None:
        self.backend = backend
        self._pending: dict[str, _Pending] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, req: Request) -> None:
        kind, text = req.sampling.grammar
        fut = self.backend.submit(kind, text)
        self._pending[req.rid] = _Pending(req, kind, text, fut, time.monotonic() + self.backend.timeout_s)

    def remove(self, rid: str) -> Request | None:
        p = self._pending.pop(rid, None)
        return None if p is None else p.req

    def ready(self) -> list[tuple[Request, str | None]]:
        """Requests whose compile ended: (request with its grammar state, None) or (request, error)."""
        now = time.monotonic()
        out = []
        for rid, p in list(self._pending.items()):
            if not p.future.done() and now < p.deadline:
                continue
            del self._pending[rid]
            try:
                if not p.future.done():
                    raise self.backend.timed_out(p.kind, p.text)
                p.req.grammar = self.backend.matcher(self.backend.result(p.kind, p.future))
                out.append((p.req, None))
            except GrammarError as exc:
                out.append((p.req, str(exc)))
        return out

    def wait(self, timeout_s: float) -> None:
        """Block until a compile ends or `timeout_s` passes (a step with nothing else to run)."""
        concurrent.futures.wait(
            [p.future for p in self._pending.values()],
            timeout=timeout_s,
            return_when=concurrent.futures.FIRST_COMPLETED,
        )
