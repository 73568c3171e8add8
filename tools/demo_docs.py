"""The console's screens on the demo fleet as text, for docs/DEMO.md and the README, and their structure.

`tools/render_demo_docs.py` starts the demo fleet (profiles/demo.toml on free ports, in a scratch state
directory), drives the real console over it with Textual's pilot, and writes what each screen draws
between marker comments:

    <!-- demo-screen:fleet -->
    ```text
    ...the screen, as drawn...
    ```
    <!-- /demo-screen:fleet -->

tests/console/test_demo_docs.py renders the same screens and compares their structure (column headers,
screen titles, sections, key bindings shown) with those blocks; volatile values (times, rates, pids,
counts) are masked, so only a change of what the console shows fails it.
"""

from __future__ import annotations

import io
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_PROFILE = ROOT / "profiles" / "demo.toml"
DEMO_DOC = ROOT / "docs" / "DEMO.md"
README = ROOT / "README.md"
UPDATE_COMMAND = "python3 tools/render_demo_docs.py"

SIZE = (160, 45)  # the terminal the screens are drawn in
DEMO_BASE_PORT = 30100  # profiles/demo.toml's ports, shown in the docs whatever ports the run used
DEMO_STATE_DIR = "~/.local/state/tokenspeed/demo"  # where `tokenspeed console profiles/demo.toml` keeps it
SERVERS = ("demo-dense-0", "demo-dense-1", "demo-moe-0")

# Block name -> what it shows: a screen, or (`fleet-table`, the README's) the top of the fleet screen.
SCREENS = ("fleet", "help", "server", "experts", "logs", "profile", "gpus")
BLOCKS = (*SCREENS, "fleet-table")

# Glyphs of plots, heatmaps, scrollbars, borders and the cursor: drawn, not read.
_DRAWN = re.compile(r"[\u2500-\u257f\u2580-\u259f▔▶●]")


# ---------------------------------------------------------------------------------------- the demo fleet


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(span: int = 30) -> int:
    """A base port with `span` free ports above it (three servers, each with the ports it derives)."""
    for base in range(24000, 29000, 100):
        if all(_port_free(base + d) for d in range(span)):
            return base
    raise RuntimeError("no free block of 30 ports between 24000 and 29000")


def _tokenspeed(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", *args], capture_output=True, text=True, timeout=timeout
    )


@dataclass(frozen=True)
class DemoRun:
    """A running demo fleet and what makes its screens differ from a run of the quick start."""

    profile: Path
    state_dir: Path
    base_port: int

    def relabel(self, text: str) -> str:
        """The screens as `tokenspeed console profiles/demo.toml` draws them: its ports, paths and host."""

        def port(match: re.Match) -> str:
            offset = int(match[2]) - self.base_port
            return match[1] + str(DEMO_BASE_PORT + offset if 0 <= offset < 100 else match[2])

        text = re.sub(r"(127\.0\.0\.1:|base_port = )(\d+)", port, text)
        text = text.replace(str(self.state_dir), DEMO_STATE_DIR).replace(
            str(self.profile), "profiles/demo.toml"
        )
        text = text.replace(str(ROOT) + "/", "")
        # The GPUs screen names the machine: "no GPU found on NAME (cpu)".
        return text.replace(f" on {socket.gethostname()} (", " on host (")


@contextmanager
def demo_fleet(timeout: float = 300.0) -> Iterator[DemoRun]:
    """profiles/demo.toml, unchanged but for its ports, under a supervisor in a scratch directory;
    stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="ts-demo-docs-") as scratch:
        base = free_base_port()
        profile = Path(scratch) / "demo.toml"
        text = DEMO_PROFILE.read_text()
        assert f"base_port = {DEMO_BASE_PORT}" in text, "profiles/demo.toml moved its ports"
        profile.write_text(text.replace(f"base_port = {DEMO_BASE_PORT}", f"base_port = {base}"))
        state_dir = Path(scratch) / "state"
        run = DemoRun(profile, state_dir, base)
        try:
            up = _tokenspeed(
                "up", "-d", str(profile), "--state-dir", str(state_dir), "--timeout", str(timeout),
                timeout=timeout + 30,
            )  # fmt: skip
            if up.returncode != 0:
                raise RuntimeError(f"the demo fleet did not start:\n{up.stdout}{up.stderr}")
            yield run
        finally:
            if state_dir.exists():
                _tokenspeed("down", "--state-dir", str(state_dir), "--timeout", "30", timeout=60)


# ---------------------------------------------------------------------------------------- the screens


def screen_text(app) -> list[str]:
    """The terminal's lines as the console draws them now, every widget and modal composed."""
    from rich.console import Console

    console = Console(width=app.size.width, file=io.StringIO(), record=True, color_system=None)
    console.print(app.screen._compositor.render_update(full=True))
    return [line.rstrip() for line in console.export_text().splitlines()]


def _tidy(lines: list[str]) -> list[str]:
    """No trailing blank lines, and at most one blank line in a row (the fleet screen's empty rows)."""
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


async def _until(pilot, app, condition: Callable[[list[str]], bool], what: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = screen_text(app)
        if condition(lines):
            return lines
        await pilot.pause(0.5)
    raise AssertionError(f"timed out waiting for {what}; the screen:\n" + "\n".join(lines))


def _fleet_busy(app) -> bool:
    """Every server READY with latencies to show, the MoE one with its balance."""
    screen = app.screen
    keys = [c.key for c in getattr(screen, "shown", ())]
    rows = {
        name: dict(zip(keys, (c.plain for c in cells), strict=True)) for name, cells in screen.cells.items()
    }
    # AGE shows only while some values are older than two polls (a loaded machine): wait them out.
    if set(rows) != set(SERVERS) or "bal" not in keys or "age" in keys:
        return False
    # Each server has answered the load inside the TTFT window, so no column shows "-" for lack of traffic.
    busy = all(r["state"] == "READY" and not r.get("ttft", "-").startswith("-") for r in rows.values())
    return busy and bool(rows["demo-moe-0"]["bal"])


# A screen whose drawing does not yet match what is expected is looked at again for this long before it
# is taken as drawn: a loaded machine has been caught between a screen's first lines and its last.
SETTLE_SECONDS = 30.0


async def capture(
    state_dir: Path,
    timeout: float = 180.0,
    settled: Callable[[str, list[str]], bool] | None = None,
) -> dict[str, list[str]]:
    """Each screen of the console over the fleet in `state_dir`, drawn in a SIZE terminal, as text.

    `settled(screen, lines)`, when given, says whether a drawing is the one expected (the test: its
    structure matches the docs). Once a screen's own readiness condition holds, it is drawn again every
    half second until `settled` says yes or SETTLE_SECONDS pass; then the last drawing is taken, so a
    screen that really differs is still returned, and compared, as drawn."""
    from console.tui.app import ConsoleApp
    from console.tui.live_source import LiveSource

    app = ConsoleApp(LiveSource(state_dir, timeout=2.0), interval=1.0)
    shots: dict[str, list[str]] = {}

    async def shot(name: str, ready: Callable[[list[str]], bool], what: str, wait: float) -> None:
        lines = await _until(pilot, app, ready, what, wait)
        deadline = time.monotonic() + SETTLE_SECONDS
        while settled is not None and not settled(name, _tidy(lines)) and time.monotonic() < deadline:
            await pilot.pause(0.5)
            lines = screen_text(app)
        shots[name] = lines

    async with app.run_test(size=SIZE) as pilot:
        await shot("fleet", lambda s: _fleet_busy(app), "three busy READY servers", timeout)
        await pilot.press("question_mark")
        await shot("help", lambda s: any("esc closes" in x for x in s), "help", 30)
        await pilot.press("escape")
        await pilot.press("2")  # the cursor's server: the first row, demo-dense-0
        await shot(
            "server", lambda s: any("ServerArgs (resolved)" in x for x in s)
            and any("status: ready" in x for x in s) and any("PID" in x for x in s)
            # a plot without samples yet draws "no samples" where the docs show its figures (a loaded CI
            # machine caught the screen before its first latency sample)
            and not any("no samples" in x for x in s), "the server screen", 60,
        )  # fmt: skip
        await pilot.press("1", "down", "down", "3")  # demo-moe-0
        await shot(
            "experts", lambda s: any("demo-moe-0" in x for x in s) and any("rebalances:" in x for x in s),
            "the experts screen", 60,
        )  # fmt: skip
        await pilot.press("4")
        await shot(
            "logs", lambda s: any("demo-moe-0  log" in x for x in s)
            and any("the server is ready" in x for x in s), "the logs screen", 60,
        )  # fmt: skip
        await pilot.press("5")
        await shot("profile", lambda s: any(": valid," in x for x in s), "the profile", 60)
        await pilot.press("6")
        # the plan's verdict line comes before its table and the notes under it (a CI run caught the screen
        # between the two): wait for the last server's note
        await shot(
            "gpus", lambda s: any("fleet demo:" in x for x in s)
            and any(x.lstrip().startswith("demo-moe-0:") for x in s), "the GPUs", 60,
        )  # fmt: skip
    return {name: _tidy(lines) for name, lines in shots.items()}


def screen_blocks(screen: str, lines: list[str], relabel: Callable[[str], str]) -> dict[str, str]:
    """The blocks one screen gives: itself, relabelled, and for the fleet screen also the README's table."""
    text = relabel("\n".join(lines))
    if screen != "fleet":
        return {screen: text}
    fleet = text.splitlines()
    end = next((i for i, line in enumerate(fleet[2:], 2) if not line.strip()), len(fleet))
    return {"fleet": text, "fleet-table": "\n".join(fleet[1:end])}


def blocks_of(shots: dict[str, list[str]], relabel: Callable[[str], str]) -> dict[str, str]:
    """The text of every block: each screen relabelled, and the README's table from the fleet screen."""
    blocks: dict[str, str] = {}
    for name in SCREENS:
        blocks.update(screen_blocks(name, shots[name], relabel))
    return blocks


# ---------------------------------------------------------------------------------------- marker blocks


def _block_re(name: str) -> re.Pattern:
    return re.compile(
        rf"(<!-- demo-screen:{re.escape(name)} -->\n```text\n)(.*?)(\n```\n<!-- /demo-screen:{re.escape(name)} -->)",
        re.S,
    )


def read_blocks(text: str) -> dict[str, str]:
    """The generated blocks a document holds, by name."""
    found = {}
    for name in BLOCKS:
        match = _block_re(name).search(text)
        if match:
            found[name] = match[2]
    return found


def write_blocks(text: str, blocks: dict[str, str]) -> str:
    """`text` with each of its generated blocks replaced by the new one of the same name."""
    for name, body in blocks.items():
        text = _block_re(name).sub(lambda m, body=body: m[1] + body + m[3], text)
    return text


# ---------------------------------------------------------------------------------------- structure


def _mask(segment: str) -> str:
    """Numbers, durations, rates and percentages read '#'; so does a '-' standing for a missing value."""
    segment = re.sub(r"\d[\w.:,%/]*", "#", segment)
    return re.sub(r"(?<!\S)[-#/]+(?!\S)", "#", segment)


def _segments(lines: list[str]) -> list[str]:
    """The labels of a screen: its text split at column gaps, masked, only pieces that hold a word."""
    found = []
    for line in lines:
        for piece in re.split(r"\s{2,}", _DRAWN.sub("  ", line).strip()):
            piece = _mask(piece)
            if re.search(r"[A-Za-z]{2,}", piece):
                found.append(piece)
    return found


def _keys(lines: list[str]) -> str:
    """The key bindings the footer shows."""
    return " ".join(lines[-1].split())


def _table(lines: list[str]) -> dict[str, object]:
    """The fleet table: its column headers (with the sort arrow), the servers in it, the lines above it."""
    at = next((i for i, line in enumerate(lines) if line.lstrip().startswith("NAME")), None)
    if at is None:
        return {"above": [], "columns": [], "servers": []}
    rows = []
    for line in lines[at + 1 :]:
        if not line.strip():
            break
        rows.append(_DRAWN.sub(" ", line).split()[0])
    # The load line's tail (skipped arrivals, the rate over the last minute) comes and goes.
    above = [
        _mask(re.sub(r"(, skipped|\s+\().*", "", " ".join(line.split())))
        for line in lines[:at]
        if line.strip()
    ]
    return {"above": above, "columns": re.split(r"\s{2,}", lines[at].strip()), "servers": sorted(rows)}


# A row of the Server screen's Processes panel: pid, CPU % (or "-" before its second sample), resident memory.
_PROCESS_ROW = re.compile(r"^\s*\d+\s+(\d+%|-)\s+[\d.]+ [KMGT]iB\b")


def _server(lines: list[str]) -> list[str]:
    """The Server screen's labels: the lines above the charts whole, then the charts' column on the left and
    the side column (latency, processes, live state, mapping, resolved ServerArgs) apart. The side column
    goes without its process rows and the ServerArgs rows under the table's header: how many processes a
    server has when the screen is drawn (the resource tracker and the body parser start on their own time)
    moves everything under them, and the screen's height cuts the ServerArgs table where that lands."""
    top = next((i for i, line in enumerate(lines) if line.strip().startswith("tokens/s")), None)
    side = next((line.index("Processes") for line in lines if line.rstrip().endswith("Processes")), None)
    if top is None or side is None:
        return _segments(lines)
    x = side - 2  # the side column's titles sit two columns in from its edge
    right: list[str] = []
    for line in lines[top:]:
        part = line[x:]
        if _PROCESS_ROW.match(part):
            continue
        right.append(part)
        if re.search(r"\bargument\s+value\b", part):
            break
    return _segments(lines[:top]) + _segments([line[:x] for line in lines[top:]]) + _segments(right)


def structure(name: str, text: str) -> dict[str, object]:
    """What a block must keep from one run to the next: what the console shows, not the values."""
    lines = text.splitlines()
    if name == "fleet-table":
        return _table(lines)
    if name == "fleet":
        return {**_table(lines), "keys": _keys(lines)}
    if name == "help":  # the modal's lines only: the screen under it shows at its sides
        inside = [line[line.index("█") + 1 : line.rindex("█")] for line in lines if line.count("█") >= 2]
        return {"help": _segments(inside), "keys": _keys(lines)}
    if name == "logs":  # the log lines themselves come and go
        return {"title": _segments(lines[:3]), "keys": _keys(lines)}
    body = [re.sub(r"NVML unavailable: [^;]*", "NVML unavailable: #", line) for line in lines[:-1]]
    if name == "server":
        return {"labels": _server(body), "keys": _keys(lines)}
    return {"labels": _segments(body), "keys": _keys(lines)}
