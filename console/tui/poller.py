"""The poll loop: one fetch at a time in a thread worker; the next is scheduled only when it finishes.

This is the dolphie pattern: a slow or dead supervisor stretches the gap between polls instead of
piling up overlapping requests, and the UI thread never waits on the network.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from textual.app import App
from textual.timer import Timer

from console.tui.model import Snapshot
from console.tui.source import DataSource, SourceError, SourceUnreachable

INTERVALS = (0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass
class PollState:
    interval: float = 1.0
    paused: bool = False
    in_flight: bool = False
    polls: int = 0
    last_duration_s: float = 0.0


def fetch(source: DataSource, request: Callable[[DataSource], object] | None) -> Snapshot:
    """One poll, in the worker thread: the fleet, then the visible screen's extra data."""
    fleet = error = extra = extra_error = None
    unreachable = False
    try:
        fleet = source.fleet()
    except SourceError as exc:
        error = str(exc)
        unreachable = isinstance(exc, SourceUnreachable)
    except Exception as exc:  # a bug in a parser must not kill the loop
        error = f"{type(exc).__name__}: {exc}"
    if request is not None:
        try:
            extra = request(source)
        except SourceError as exc:
            extra_error = str(exc)
        except Exception as exc:
            extra_error = f"{type(exc).__name__}: {exc}"
    return Snapshot(
        fleet=fleet,
        error=error,
        polled_at=time.time(),
        extra=extra,
        extra_error=extra_error,
        unreachable=unreachable,
    )


class Poller:
    """Drives polls for an app; `deliver(snapshot, request_owner)` runs on the UI thread."""

    def __init__(
        self,
        app: App,
        source: DataSource,
        request_for_screen: Callable[[], tuple[object, Callable[[DataSource], object] | None]],
        deliver: Callable[[Snapshot, object], None],
        interval: float,
    ) -> None:
        self._app = app
        self._source = source
        self._request_for_screen = request_for_screen
        self._deliver = deliver
        self._timer: Timer | None = None
        self._again = False
        self.state = PollState(interval=interval)

    def start(self) -> None:
        self.poll_now()

    def poll_now(self) -> None:
        """Poll as soon as possible; if a poll is running, run one more right after it."""
        if self.state.in_flight:
            self._again = True
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._begin()

    def set_paused(self, paused: bool) -> None:
        self.state.paused = paused
        if paused and self._timer is not None:
            self._timer.stop()
            self._timer = None
        elif not paused:
            self.poll_now()

    def set_interval(self, interval: float) -> None:
        self.state.interval = interval
        if not self.state.paused and not self.state.in_flight:
            self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = self._app.set_timer(self.state.interval, self._begin)

    def _begin(self) -> None:
        self._timer = None
        if self.state.in_flight:
            return
        owner, request = self._request_for_screen()
        self.state.in_flight = True
        self._app.run_worker(
            lambda: self._run(owner, request), thread=True, group="poll", exit_on_error=False
        )

    def _run(self, owner: object, request) -> None:
        started = time.monotonic()
        snapshot = fetch(self._source, request)
        self.state.last_duration_s = time.monotonic() - started
        try:
            self._app.call_from_thread(self._finish, snapshot, owner)
        except RuntimeError:
            # The app closed while this poll was in flight; nothing is left to draw on.
            self.state.in_flight = False

    def _finish(self, snapshot: Snapshot, owner: object) -> None:
        self.state.in_flight = False
        self.state.polls += 1
        try:
            self._deliver(snapshot, owner)
        finally:
            if self._again:
                self._again = False
                self._begin()
            elif not self.state.paused:
                self._schedule()
