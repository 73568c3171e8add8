"""Waiting, in tests, for something a real process does in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float, what: str, poll: float = 0.1) -> T:
    """The first truthy answer of `check`, asked every `poll` seconds; AssertionError naming `what` once
    `timeout` seconds pass without one."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(poll)
    return value
