"""`tokenspeed console` in a real terminal (tmux): start a fleet from a profile, drive it, leave and stop it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from console.client import SupervisorClient
from tests.console.tui_support import free_base_port, write_profile

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"
)

REPO = Path(__file__).resolve().parents[2]


class Terminal:
    """One tmux session running a command; `screen()` is what a person would see."""

    def __init__(self, command: str, width: int = 160, height: int = 45) -> None:
        self.name = f"tsc-{uuid.uuid4().hex[:8]}"
        # Keep the pane after the command exits, so its last words can be read.
        # COLUMNS/LINES left by a test runner would override the real terminal size.
        wrapped = f"env -u COLUMNS -u LINES {command}; echo EXIT=$?; sleep 120"
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                str(width),
                "-y",
                str(height),
                "-c",
                str(REPO),
                wrapped,
            ],
            check=True,
        )
        # A detached session may start at the server's default size; pin the one asked for.
        subprocess.run(
            ["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)],
            capture_output=True,
        )

    def screen(self) -> str:
        result = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        )
        return result.stdout

    def send(self, *keys: str) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.15)

    def wait_for(self, *texts: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(text in screen for text in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{texts} not on screen after {timeout}s; screen:\n{screen}")

    def wait_gone(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text not in self.screen():
                return
            time.sleep(0.1)
        raise AssertionError(f"{text!r} still on screen after {timeout}s")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def test_console_starts_a_fleet_from_a_profile_and_stops_it_on_the_way_out():
    root = Path(tempfile.mkdtemp(prefix="tsc-"))
    state_dir = root / "state"
    profile = write_profile(root, "term", replicas=3, base_port=free_base_port(3))
    term = Terminal(f"{sys.executable} -m tokenspeed console {profile} --state-dir {state_dir}")
    try:
        screen = term.wait_for("term-0", "term-1", "term-2", "3 servers", "3 ready", timeout=60)
        assert "TTFT p50/p99" in screen and "READY" in screen
        term.wait_for("%")  # KV usage arrived from the scrapes
        term.send("2")
        term.wait_for("tokens/s", "ServerArgs (resolved)", "ep_size")
        term.send("4")
        term.wait_for("listening on http://127.0.0.1")
        term.send("1", "R")
        term.wait_for("Restart term-0?")
        term.send("n")
        term.wait_gone("Restart term-0?")
        term.send("q")
        term.wait_for("This console started the fleet")
        with SupervisorClient(state_dir) as client:
            pids = [s["pid"] for s in client.fleet()["servers"]]
        term.send("s")
        screen = term.wait_for("EXIT=0", timeout=60)
        assert "the fleet is stopped" in screen
        with SupervisorClient(state_dir) as client:
            assert not client.alive()
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        assert alive == []
    finally:
        term.close()
        with SupervisorClient(state_dir, timeout=1.0) as client:
            if client.alive():
                client.shutdown()
        shutil.rmtree(root, ignore_errors=True)
