"""What `tokenspeed console` costs: CPU at 1 Hz over a 64-server fleet, start-up time, key latency.

    python benchmarks/console_cost.py [--servers 64] [--seconds 30] [--screens fleet,server,...]
        [--py-spy DIR] [--out benchmarks/results/console_cost.json]

A real supervisor runs N lightweight metrics endpoints (tests/console/metrics_endpoint.py: real HTTP
processes exporting the scheduler, KV, latency-histogram and expert-load families) and scrapes them at
1 Hz. The console runs in a real terminal (tmux) attached to that supervisor. Measured:
  start-up   launch -> every server's row on screen
  CPU        console process CPU time / wall time while it polls at 1 Hz, on every screen (fleet with its
             events pane, server, experts, logs, profile, gpus)
  keys       screen switch latency: key sent -> the new screen on the terminal
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from console.client import SupervisorClient  # noqa: E402
from console.tui.launch import start_supervisor  # noqa: E402
from tokenspeed.bench_results import write_results  # noqa: E402

ENDPOINT = REPO / "tests" / "console" / "metrics_endpoint.py"


def free_ports(count: int) -> int:
    """A base port with `count` consecutive free ports."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65000:
            continue
        ok = True
        for port in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def write_profile(root: Path, servers: int) -> Path:
    path = root / "bench.toml"
    path.write_text(
        f"""[server]
model = "tiny"
device = "cpu"

[fleet]
name = "bench"
replicas = {servers}
base_port = {free_ports(servers)}
port_stride = 1
command = ["{sys.executable}", "{ENDPOINT}"]
metrics_interval_s = 1.0

[fleet.health]
interval_s = 2.0
"""
    )
    return path


class Terminal:
    def __init__(self, command: str, width: int = 200, height: int = 80) -> None:
        self.name = f"bench-{uuid.uuid4().hex[:8]}"
        # A tmux server of its own: another program's `tmux kill-server` never ends this benchmark.
        self.tmux = ["tmux", "-L", self.name]
        wrapped = f"env -u COLUMNS -u LINES {command}; sleep 600"
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), wrapped],
            check=True,
        )

    def screen(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        ).stdout

    def send(self, key: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, key], check=True)

    def wait_for(self, predicate, timeout: float = 120.0, step: float = 0.02) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if predicate(self.screen()):
                return time.monotonic() - start
            time.sleep(step)
        raise TimeoutError(f"screen never matched; last screen:\n{self.screen()}")

    def console_process(self) -> psutil.Process:
        pane = subprocess.run(
            [*self.tmux, "display", "-p", "-t", self.name, "#{pane_pid}"], capture_output=True, text=True
        ).stdout.strip()
        for proc in psutil.Process(int(pane)).children(recursive=True):
            if "console" in " ".join(proc.cmdline()):
                return proc
        raise RuntimeError("console process not found")

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def cpu_share(proc: psutil.Process, seconds: float, term: Terminal) -> tuple[float, int]:
    """(percent of one core the process used over `seconds` of wall time, polls it made meanwhile).

    Polls are counted from the status line's "polled HH:MM:SS" (one poll a second at most): on a loaded
    machine a poll takes longer and the console polls less often, so CPU per poll is the figure that
    load barely moves."""
    polled: set[str] = set()
    before = proc.cpu_times()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        polled.update(re.findall(r"polled (\d\d:\d\d:\d\d)", term.screen()))
        time.sleep(0.25)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (time.monotonic() - start), len(polled)


def rows_on_screen(screen: str, servers: int) -> bool:
    return f"{servers} servers" in screen and all(f"bench-{i} " in screen for i in (0, servers - 1))


def on_fleet_screen(screen: str, servers: int) -> bool:
    return "RUN/WAIT" in screen and rows_on_screen(screen, servers)


# screen -> (its number key, a text only it shows, a text it shows once its first poll is drawn);
# the events pane is part of the fleet screen
SCREENS = {
    "fleet": ("1", "RUN/WAIT", "RUN/WAIT"),
    "server": ("2", "ServerArgs (resolved)", "argv"),
    "experts": ("3", "expert load", "rebalances"),
    "logs": ("4", "log  level>=", "INFO"),
    "profile": ("5", "Plan (ctrl+t)", "valid, "),
    "gpus": ("6", "Whose memory", "fleet bench:"),
}


def py_spy(pid: int, out: Path, seconds: float) -> subprocess.Popen:
    """Where the console spends its CPU on one screen: py-spy's collapsed stacks (active samples only),
    recorded over the same window as the CPU measurement (py-spy runs beside it, in its own process)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            "py-spy",
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "500",
            "--format",
            "raw",
            "--nonblocking",  # never pauses the console: it polls as often as it would unobserved
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="CPU measurement window per screen")
    parser.add_argument(
        "--screens", default=",".join(SCREENS), help=f"screens to measure, in order (of {','.join(SCREENS)})"
    )
    parser.add_argument("--py-spy", metavar="DIR", help="also record py-spy stacks per screen into DIR")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "console_cost.json"))
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("console_cost: tmux is needed (apt-get install tmux)", file=sys.stderr)
        return 2

    root = Path(tempfile.mkdtemp(prefix="tsb-"))
    state_dir = root / "state"
    profile = write_profile(root, args.servers)
    client = SupervisorClient(state_dir, timeout=5.0)
    terminals: list[Terminal] = []
    try:
        t0 = time.monotonic()
        start_supervisor(profile, state_dir, timeout=180)  # generous: a loaded machine starts slowly
        while True:
            servers = client.fleet()["servers"]
            if all(s["state"] == "READY" and s["metrics"] for s in servers):
                break
            if time.monotonic() - t0 > 300:
                raise TimeoutError("fleet not READY")
            time.sleep(0.5)
        fleet_ready_s = time.monotonic() - t0
        print(f"fleet of {args.servers} endpoints READY in {fleet_ready_s:.1f}s")

        # Start-up: three cold launches, median.
        startups, startup_cpu = [], []
        attempts = 0
        while len(startups) < 3:
            term = Terminal(f"{sys.executable} -m tokenspeed console --state-dir {state_dir}")
            terminals.append(term)
            took = term.wait_for(lambda s: rows_on_screen(s, args.servers) or "no supervisor answers" in s)
            if "no supervisor answers" in term.screen() and attempts < 5:
                # A supervisor scraping 64 servers on a loaded machine can miss the console's 2 s check.
                attempts += 1
                term.close()
                terminals.remove(term)
                continue
            startups.append(took)
            # CPU seconds spent to get there: unlike wall time, barely moved by other load on the machine.
            times = term.console_process().cpu_times()
            startup_cpu.append(times.user + times.system)
            if len(startups) < 3:
                term.close()
                terminals.remove(term)
        print(
            f"start-up to {args.servers} rows on screen: {[round(s, 2) for s in startups]} s wall, "
            f"{[round(c, 2) for c in startup_cpu]} s CPU"
        )

        term = terminals[-1]
        proc = term.console_process()

        def cpu_s() -> float:
            times = proc.cpu_times()
            return times.user + times.system

        to_server, to_fleet, switch_cpu = [], [], []
        for _ in range(5):
            before = cpu_s()
            term.send("2")
            to_server.append(1000 * term.wait_for(lambda s: SCREENS["server"][1] in s))
            switch_cpu.append(1000 * (cpu_s() - before))
            before = cpu_s()
            term.send("1")
            to_fleet.append(1000 * term.wait_for(lambda s: on_fleet_screen(s, args.servers)))
            switch_cpu.append(1000 * (cpu_s() - before))
        key_ms = to_server + to_fleet
        print(
            "screen switch latency (key -> new screen in the terminal): "
            f"to server median {statistics.median(to_server):.0f} ms, "
            f"to fleet median {statistics.median(to_fleet):.0f} ms; "
            f"console CPU per switch median {statistics.median(switch_cpu):.0f} ms"
        )

        cpu: dict[str, float] = {}
        per_poll: dict[str, float] = {}
        for screen in args.screens.split(","):
            key, marker, drawn = SCREENS[screen]
            term.send(key)
            if screen == "fleet":
                term.wait_for(lambda s: on_fleet_screen(s, args.servers))
            else:
                term.wait_for(lambda s, m=marker, d=drawn: m in s and d in s)
            time.sleep(3.0)  # the switch itself and the first full draw are not the steady state
            spy = py_spy(proc.pid, Path(args.py_spy) / f"{screen}.txt", args.seconds) if args.py_spy else None
            if spy is not None:
                time.sleep(1.0)  # py-spy attaches: the CPU window starts inside its recording
            cpu[screen], polls = cpu_share(proc, args.seconds, term)
            if spy is not None:
                spy.wait()  # and ends before the next screen's
            per_poll[screen] = 10 * cpu[screen] * args.seconds / max(polls, 1)  # ms of CPU a poll
            print(
                f"CPU on the {screen} screen at 1 Hz: {cpu[screen]:.2f}% of one core "
                f"({polls} polls in {args.seconds:g} s: {per_poll[screen]:.1f} ms CPU a poll)"
            )
        rss_mb = proc.memory_info().rss / 2**20

        result = {
            "benchmark": "console_cost",
            "servers": args.servers,
            "interval_s": 1.0,
            "window_s": args.seconds,
            "startup_s": {"median": statistics.median(startups), "runs": startups},
            "startup_cpu_s": {"median": statistics.median(startup_cpu), "runs": startup_cpu},
            "cpu_percent_one_core": {f"{name}_screen": value for name, value in cpu.items()},
            # CPU a poll (and its redraw) costs; at 1 Hz, ms a poll / 10 = % of one core
            "cpu_ms_per_poll": {f"{name}_screen": value for name, value in per_poll.items()},
            "screen_switch_ms": {
                "median": statistics.median(key_ms),
                "max": max(key_ms),
                "to_server_median": statistics.median(to_server),
                "to_fleet_median": statistics.median(to_fleet),
                "cpu_ms_median": statistics.median(switch_cpu),
                "note": "wall time includes tmux capture-pane polling every 20 ms and waiting for a CPU",
            },
            "console_rss_mib": rss_mb,
            "fleet_ready_s": fleet_ready_s,
            "terminal": "tmux 200x80",
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "load_avg_1m": os.getloadavg()[0],
            },
            "textual": __import__("textual").__version__,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        write_results(args.out, result)
        return 0
    finally:
        for term in terminals:
            term.close()
        try:
            client.shutdown()
            deadline = time.monotonic() + 60
            while client.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
        except Exception as exc:  # the fleet may already be gone; report, never hide a leftover
            print(f"console_cost: shutdown: {exc}", file=sys.stderr)
        client.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
