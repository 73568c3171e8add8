"""`tokenspeed logs SERVER -f` over a real supervisor while the log rotates and the server restarts.

A busy server writes numbered lines (busy_http.py) into a log rotated every few KiB. The follower
must print each line exactly once and in order across rotations and across a restart, and the
rotated files themselves must hold every line (rotation loses nothing on disk).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

from tests.console.conftest import tokenspeed_running

HERE = Path(__file__).resolve().parent
BUSY = HERE / "busy_http.py"
LINE = re.compile(r"^(\S+) pid (\d+) line (\d+)$")
MAX_BYTES = 8192
BACKUPS = 60  # every rotated file of the test stays on disk, so the disk can be checked too


class Follower:
    """`tokenspeed logs NAME -f -n 0` in a subprocess, its lines collected by a thread."""

    def __init__(self, name: str, state_dir: Path):
        self.proc = tokenspeed_running("logs", name, "-f", "-n", "0", "--state-dir", str(state_dir))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def numbered(self, pid: int) -> list[int]:
        return [int(m[3]) for line in list(self.lines) if (m := LINE.match(line)) and int(m[2]) == pid]

    def wait_for(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"logs -f exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, f"logs -f: timed out waiting for {what}: {self.lines[-5:]}"
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._reader.join(5)


def disk_lines(log: Path) -> list[str]:
    """The whole log as rotation left it: oldest backup first, the live file last."""
    backups = sorted(log.parent.glob(log.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    return [line for p in [*backups, log] for line in p.read_text().splitlines()]


def assert_consecutive(numbers: list[int], first: int | None, what: str) -> None:
    assert numbers, f"no line of {what}"
    start = numbers[0] if first is None else first
    expected = list(range(start, start + len(numbers)))
    if numbers != expected:
        wrong = next(i for i, (a, b) in enumerate(zip(numbers, expected, strict=True)) if a != b)
        raise AssertionError(f"{what}: line {expected[wrong]} expected, got {numbers[wrong : wrong + 5]}")


def test_follow_across_rotations_and_a_restart_loses_and_repeats_nothing(make_fleet):
    fleet = make_fleet(
        replicas=1,
        command=[sys.executable, str(BUSY), "--log-lines-per-s", "600"],
        log_max_bytes=MAX_BYTES,
        log_backups=BACKUPS,
    )
    name = fleet.server(0)
    log = fleet.state_dir / "logs" / f"{name}.log"
    result = fleet.up()
    assert result.returncode == 0, result.stdout + result.stderr
    first_pid = fleet.servers()[name]["pid"]
    follower = Follower(name, fleet.state_dir)
    try:
        # ~30 bytes a line: 1500 lines fill the file five times over (at least four rotations).
        follower.wait_for(lambda: len(follower.numbered(first_pid)) >= 1500, 60, "1500 lines")
        assert log.with_name(log.name + ".4").exists(), sorted(p.name for p in log.parent.iterdir())
        assert fleet.cli("restart", name).returncode == 0
        servers = fleet.wait_for(
            lambda s: s[name]["state"] == "READY" and s[name]["pid"] != first_pid, what="the restart"
        )
        second_pid = servers[name]["pid"]
        follower.wait_for(lambda: len(follower.numbered(second_pid)) >= 1500, 60, "1500 lines after restart")
    finally:
        follower.stop()
    seen = follower.lines
    old, new = follower.numbered(first_pid), follower.numbered(second_pid)
    assert_consecutive(old, None, f"the first process ({first_pid}) through logs -f")
    assert_consecutive(new, 0, f"the restarted process ({second_pid}) through logs -f")
    # The supervisor's notes about the restart come between the two processes' lines.
    stop_note = next(i for i, line in enumerate(seen) if "stopping: SIGTERM" in line)
    start_note = next(i for i, line in enumerate(seen) if f"started (pid {second_pid})" in line)
    assert stop_note < start_note < seen.index(f"{name} pid {second_pid} line 0")
    # On disk: every line of both processes, in order, and what logs -f printed is exactly a part of it.
    on_disk = disk_lines(log)
    assert_consecutive(
        [int(m[3]) for line in on_disk if (m := LINE.match(line)) and int(m[2]) == first_pid],
        0,
        "disk, first",
    )
    assert_consecutive(
        [int(m[3]) for line in on_disk if (m := LINE.match(line)) and int(m[2]) == second_pid],
        0,
        "disk, second",
    )
    start = on_disk.index(seen[0])
    assert on_disk[start : start + len(seen)] == seen
    assert all(len(p.read_bytes()) <= 2 * MAX_BYTES for p in log.parent.glob(log.name + "*"))


async def test_console_logs_screen_follows_across_rotations(make_fleet):
    """The Logs screen polls the supervisor's tail (which reaches into NAME.log.1): in follow mode it
    shows each line once and in order while the log rotates under it."""
    from console.tui.app import ConsoleApp
    from console.tui.live_source import LiveSource
    from tests.console.tui_pilot import log_lines, wait_for

    fleet = make_fleet(
        replicas=1,
        command=[sys.executable, str(BUSY), "--log-lines-per-s", "100"],
        log_max_bytes=4096,
        log_backups=BACKUPS,
    )
    name = fleet.server(0)
    log = fleet.state_dir / "logs" / f"{name}.log"
    assert fleet.up().returncode == 0
    pid = fleet.servers()[name]["pid"]

    def numbered() -> list[int]:
        return [int(m[3]) for line in log_lines(app) if (m := LINE.match(line)) and int(m[2]) == pid]

    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=(120, 30)) as pilot:
        app.open_server(name, "logs")
        await wait_for(pilot, lambda: len(numbered()) >= 300, timeout=60, what="300 lines on the Logs screen")
        first_backup_count = len(list(log.parent.glob(log.name + ".*")))
        shown = numbered()
        await wait_for(
            pilot,
            lambda: len(list(log.parent.glob(log.name + ".*"))) >= first_backup_count + 2,
            timeout=60,
            what="two more rotations",
        )
        await wait_for(pilot, lambda: numbered()[-1] > shown[-1] + 100, timeout=60, what="100 more lines")
        # Never redrawn from a shorter tail (that would hide a gap): the first line is still the first.
        assert numbered()[0] == shown[0]
        assert_consecutive(numbered(), None, "the Logs screen")
