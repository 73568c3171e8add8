"""Where a server's start-up time goes, read back from its log: the phase lines (processes started, weights,
KV cache, CUDA graphs, each scheduler's phases, the front end's phases, warm-up, READY) with the seconds
since the start-up's first line (the supervisor's "started (pid N)" note in a fleet's log) and since the
phase before. The GPU fleet test and `serving_gpu.py` print this after each READY, so a slow start on the H200
says which phase took the time (Triton's JIT shows up as a long gap before the first graph is captured).

    python3 benchmarks/startup_log.py SERVER.log
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path

# The messages each phase logs (runtime/models/loader.py, execution/model_runner.py, execution/cuda_graph.py,
# engine/event_loop.py, engine/scheduler_client.py, entrypoints/http_runner.py, entrypoints/warmup.py,
# entrypoints/launch.py).
PHASES = re.compile(
    r"started \d+ child|weights: |KV cache: |CUDA graphs captured|ready: max_total_tokens"
    r"|scheduler dp\d+ tp\d+ ready|sampler \S+: warmed up|warm-up |front end start-up|the server is ready"
    r"|Traceback|Error"
)
# The server's own lines (`2026-12-04 12:35:57,577 [main] INFO name: message`) and the supervisor's notes in
# the same file (`[supervisor 2026-12-04 12:35:33] demo-0: started (pid 620)`, console/supervisor/logfile.py).
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")
NOTE = re.compile(r"^\[supervisor (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$")
# Where a start-up begins: the supervisor starting the process, else the front end spawning its children.
# (Only the launch line's own words: the READY line also says "child processes" and "started".)
SUPERVISOR_START = re.compile(r"^\S+: started \(pid ")
LAUNCH = re.compile(r"\bINFO tokenspeed\.launch: started \d+ child process")
SHOWN_CHARS = 400  # the phase lines are long; the scheduler's and the front end's must be read whole


def _stamped(line: str) -> tuple[dt.datetime, str, bool] | None:
    """(time, text, whether a supervisor note) of a stamped line, None for any other line."""
    if m := STAMP.match(line):
        return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), m.group(2), False
    if m := NOTE.match(line):
        return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"), m.group(2), True
    return None


def phase_lines(log: str) -> list[str]:
    """`+total s (+since previous) message` for each phase line of one start-up (the last in the log)."""
    rows: list[tuple[dt.datetime, str]] = []
    first: dt.datetime | None = None
    launched = False  # whether this start-up's front end has spawned its children yet
    for line in log.splitlines():
        stamped = _stamped(line)
        if stamped is None:
            continue
        when, text, note = stamped
        if note:
            if SUPERVISOR_START.match(text):  # a (re)start: only the last start-up counts
                rows, first, launched = [(when, text)], when, False
            continue
        if LAUNCH.search(text):
            if launched:  # a second start in one file with no supervisor note between (started by hand)
                rows, first = [], None
            launched = True
        first = first or when
        if PHASES.search(text):
            rows.append((when, text))
    out, before = [], first
    for when, text in rows:
        out.append(
            f"+{(when - first).total_seconds():6.1f} s (+{(when - before).total_seconds():5.1f}) "
            f"{text[:SHOWN_CHARS]}"
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
