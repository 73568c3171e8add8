"""Where a process's start-up seconds went: named phases, and what no phase covers ("other").

The front end and each scheduler rank keep one `StartupPhases`; the steps of their start-up run inside
`with phases.phase("model config"):` blocks, and the ready and READY log lines print `summary()`. Time
outside every phase is reported as "other" rather than folded into the next phase, so a slow step that
nobody named shows up as a large "other" instead of making a named phase look slow.

No torch here: the HTTP front end times its own start-up with it before it imports torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

OTHER = "other"


def process_started_at() -> float:
    """This process's start as a `time.time()` value: the zero of its start-up.

    psutil's create_time adds the start's offset since boot to the boot time, which the kernel gives in
    whole seconds and which drifts from the wall clock: on a machine up for half a day it was 0.9 s early,
    so every start-up looked 0.9 s slower in its imports. The offset is measured here against the boot
    clock instead, which is what the kernel counts it in.
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, counted from the ")" that ends field 2
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return psutil.Process().create_time()


class StartupPhases:
    """Seconds of named start-up phases, in the order they first ran; a phase that runs twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - started)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(seconds, 0.0)

    def since_start(self, name: str) -> None:
        """Book the time from the process's start until now to `name`: the interpreter's start and the
        imports, which run before any code of ours can time them."""
        self.add(name, time.time() - process_started_at())

    def summary(self, total: float) -> dict[str, float]:
        """The phases plus "other": what of `total` seconds no phase accounts for."""
        return {**self.seconds, OTHER: max(total - sum(self.seconds.values()), 0.0)}


def format_phases(phases: dict[str, float]) -> str:
    """`name 1.2 s, name 0.3 s, ...`, the form the ready lines use and `benchmarks/startup_log.py` reads."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
