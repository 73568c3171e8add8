"""Keeping a server's processes tied together: children die with their parent, the parent with any child.

- A child asks the kernel for SIGKILL when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`) and also
  checks the parent pid in its loop, which covers other platforms and a parent that died before the prctl.
- The parent watches every child's sentinel; the first unexpected exit calls `on_death`, which takes the
  whole server down with a non-zero status rather than leaving an HTTP server that can never answer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class RankFailed(RuntimeError):
    """A scheduler rank could not start, or its process is gone; the message says which rank and why."""


def die_with_parent(parent_pid: int) -> None:
    """Called first thing in a child process: be killed when `parent_pid` goes away."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            logger.warning("prctl(PR_SET_PDEATHSIG) unavailable; relying on the parent-pid check")
    # The parent may have died between fork and prctl: then we were re-parented already.
    if not parent_alive(parent_pid):
        os._exit(1)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


# The parent's "stop now" to its children. Not SIGTERM: a supervisor (or a shell's Ctrl-C) signals the
# whole process group, and a scheduler that stopped on that signal would vanish while the main process
# still drains its in-flight requests, which the watchdog would then report as a crash.
CHILD_STOP_SIGNAL = signal.SIGUSR1


class StopFlag:
    """Set by the parent's CHILD_STOP_SIGNAL so a child's loop exits cleanly.

    SIGTERM and SIGINT are ignored in children: the main process owns shutdown, drains, and then stops
    its children itself.
    """

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> StopFlag:
        signal.signal(CHILD_STOP_SIGNAL, lambda *_: self._event.set())
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return self

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


@dataclass
class ChildProcess:
    name: str  # e.g. "scheduler dp0 tp0", "data-parallel controller"
    process: BaseProcess


class ChildWatchdog:
    """A daemon thread waiting on every child's sentinel; `stop()` before terminating children on purpose."""

    def __init__(self, children: list[ChildProcess], on_death: Callable[[ChildProcess, int | None], None]):
        self._children = list(children)
        self._on_death = on_death
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="child-watchdog", daemon=True)

    def start(self) -> ChildWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        by_sentinel = {c.process.sentinel: c for c in self._children}
        ready = wait([*by_sentinel, self._wake_r])
        if self._stopping.is_set():
            return
        for s in ready:
            child = by_sentinel.get(s)
            if child is not None:
                child.process.join(timeout=1)
                code = child.process.exitcode
                logger.error("%s (pid %s) exited with code %s", child.name, child.process.pid, code)
                self._on_death(child, code)
                return


def terminate_children(children: list[ChildProcess], timeout: float = 10.0) -> None:
    """Send every child CHILD_STOP_SIGNAL, wait up to `timeout` s in total, then SIGKILL the stragglers."""
    import time

    for c in children:
        if c.process.is_alive() and c.process.pid is not None:
            try:
                os.kill(c.process.pid, CHILD_STOP_SIGNAL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    for c in children:
        c.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if c.process.is_alive():
            logger.warning("%s (pid %s) did not stop in time; killing it", c.name, c.process.pid)
            c.process.kill()
            c.process.join(timeout=2)
