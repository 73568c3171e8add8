"""Shared pieces of the CPU benchmarks (`cpu_engine.py`, `speculative.py`): the best-of-N timing loop, the
machine facts every result records, and writing the result file.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import TypeVar

import torch

Run = TypeVar("Run", bound=tuple)


def best(repeats: int, run: Callable[[], Run], before: Callable[[], object] | None = None) -> Run:
    """The fastest of `repeats` runs (each a tuple whose first item is its seconds): the one least disturbed
    by whatever else the machine does. `before` runs ahead of each, untimed: an engine's `flush_cache`, so
    that every timed run starts cold, with no prefix cached by the one before it."""
    runs = []
    for _ in range(max(1, repeats)):
        if before is not None:
            before()
        runs.append(run())
    return min(runs, key=lambda r: r[0])


def machine(threads: int) -> dict:
    """What a CPU figure depends on besides the code: recorded next to it in every result file."""
    return {
        "threads": threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine skews the figures
    }
