"""Where a server's start-up time goes, read back from its log: the phase lines (processes started, weights,
KV cache, CUDA graphs, warm-up, READY) with the seconds since the log's first line and since the phase
before. The GPU fleet test and `serving_gpu.py` print this after each READY, so a slow start on the H200
says which phase took the time (Triton's JIT shows up as a long gap before the first graph is captured).

    python3 benchmarks/startup_log.py SERVER.log
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path

# The messages each phase logs (runtime/models/loader.py, execution/model_runner.py, execution/cuda_graph.py,
# engine/event_loop.py, entrypoints/http_runner.py, entrypoints/warmup.py, entrypoints/launch.py).
PHASES = re.compile(
    r"started \d+ child|weights: |KV cache: |Captured \d+|ready: max_total_tokens|scheduler dp\d+ tp\d+ ready"
    r"|sampler \S+: warmed up|warm-up |the server is ready|Traceback|Error"
)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")


def phase_lines(log: str) -> list[str]:
    """`+total s (+since previous) message` for each phase line of one start-up (the last in the log)."""
    rows: list[tuple[dt.datetime, str]] = []
    first: dt.datetime | None = None
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if "started" in m.group(2) and "child" in m.group(2):
            rows, first = [], None  # a restart: only the last start-up counts
        first = first or when
        if PHASES.search(m.group(2)):
            rows.append((when, m.group(2)))
    out, before = [], first
    for when, text in rows:
        out.append(
            f"+{(when - first).total_seconds():6.1f} s (+{(when - before).total_seconds():5.1f}) {text[:150]}"
        )
        before = when
    return out


def print_phases(path: Path, title: str) -> None:
    try:
        lines = phase_lines(path.read_text(errors="replace"))
    except OSError as exc:
        print(f"{title}: no log ({exc})")
        return
    print(f"{title} ({path.name}):")
    for line in lines:
        print("   ", line)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print_phases(Path(arg), "start-up")
