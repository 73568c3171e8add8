"""Progress of a server's slow start-up phases (weights, CUDA graph capture), for a person and for a log.

On a terminal one status line is redrawn in place (`weights 3.2/15.0 GiB 1.4 GiB/s`); in a log file (the
supervisor's, a pipe) the same progress goes out as plain log lines, at most one every LOG_EVERY_S, so a
slow load is visibly moving without flooding the file. Either way the phase ends with one log line that
says what it did and how fast (`weights: 15.0 GiB in 10.7 s (1.4 GiB/s)`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

LOG_EVERY_S = 5.0
REDRAW_EVERY_S = 0.1
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def human_bytes(n: float) -> str:
    for name, size in _UNITS:
        if n >= size:
            return f"{n / size:.1f} {name}"
    return f"{n:.0f} B"


class Progress:
    """One phase with a known total: `advance(n)` as work is done, `finish()` once at the end."""

    def __init__(
        self,
        what: str,
        total: float,
        logger: logging.Logger,
        unit: str = "bytes",  # bytes | items
        stream: TextIO | None = None,
        tty: bool | None = None,
        log_every_s: float = LOG_EVERY_S,
    ):
        self.what = what
        self.total = max(float(total), 0.0)
        self.unit = unit
        self.logger = logger
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_every_s = log_every_s
        self.done = 0.0
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_log = self.started
        self._drawn = False

    def status(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        if self.unit == "bytes":
            return (
                f"{self.what} {human_bytes(self.done)}/{human_bytes(self.total)} "
                f"({human_bytes(self.done / elapsed)}/s)"
            )
        return f"{self.what} {self.done:.0f}/{self.total:.0f}"

    def advance(self, n: float) -> None:
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= REDRAW_EVERY_S:
                self.stream.write("\r\033[K" + self.status())
                self.stream.flush()
                self._last_draw, self._drawn = now, True
        elif now - self._last_log >= self.log_every_s:
            self.logger.info("%s", self.status())
            self._last_log = now

    def finish(self) -> float:
        """Log the phase's summary line; returns its seconds."""
        seconds = time.monotonic() - self.started
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
        if self.unit == "bytes":
            rate = human_bytes(self.done / max(seconds, 1e-9))
            self.logger.info("%s: %s in %.1f s (%s/s)", self.what, human_bytes(self.done), seconds, rate)
        else:
            self.logger.info("%s: %.0f/%.0f in %.1f s", self.what, self.done, self.total, seconds)
        return seconds
