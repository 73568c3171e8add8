"""`tokenspeed console` in a real terminal (tmux): start a fleet from a profile, drive it, leave and stop it."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from console.client import SupervisorClient
from tests.console.terminal import Terminal
from tests.console.tui_support import free_base_port, write_profile

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"
)


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
