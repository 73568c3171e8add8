"""Incident drills: the real console (pilot) over a real supervised `tokenspeed serve`, a fault injected,
and what the operator must see within a deadline, then the fix taking effect.

- a scheduler that stops (SIGSTOP) while requests are in flight: the row reads STALLED within 5 s, the
  header counts it, the events pane says so; it recovers when the scheduler runs again.
- KV pressure (a 256-token pool, long prompts): KV and preemptions drawn red; the operator raises
  `max_total_tokens` in the profile editor, saves (the notice says what applying will do), applies
  (`ctrl+l`, the confirmation lists the change) and the server comes back with the new pool.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from console.client import SupervisorClient, SupervisorError
from console.tui.app import ConsoleApp
from console.tui.launch import start_supervisor
from console.tui.live_source import LiveSource
from console.tui.screens.modals import ConfirmScreen
from tests.console.tui_pilot import row_cells, status, text_of, wait_for
from tests.console.tui_support import free_base_port

pytest.importorskip("tokenspeed.runtime.entrypoints.serve")

SIZE = (170, 45)
NAME = "drill-0"


@pytest.fixture(scope="module")
def drill_fleet():
    from tests.tiny_models import make_tiny_model

    root = Path(tempfile.mkdtemp(prefix="tsd-"))
    model = make_tiny_model("llama", root / "models")
    port = free_base_port(1)
    profile = root / "drill.toml"
    profile.write_text(
        f"""[server]
model = "{model}"
device = "cpu"
max_total_tokens = 256
block_size = 16
max_num_seqs = 4
max_model_len = 512

[env]
OMP_NUM_THREADS = "1"

[fleet]
name = "drill"
replicas = 1
base_port = {port}
startup_timeout_s = 300
stop_timeout_s = 10
metrics_interval_s = 0.5

[fleet.health]
interval_s = 1.0

[supervisor]
stall_after_s = 2
"""
    )
    state_dir = root / "state"
    start_supervisor(profile, state_dir)
    client = SupervisorClient(state_dir, timeout=5.0)
    try:
        wait_ready(client, 300)
        yield profile, state_dir, client
    finally:
        with contextlib.suppress(SupervisorError):
            client.shutdown()
        deadline = time.monotonic() + 30
        while client.alive() and time.monotonic() < deadline:
            time.sleep(0.3)
        client.close()
        shutil.rmtree(root, ignore_errors=True)


def wait_ready(client: SupervisorClient, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = client.fleet()["servers"][0]
        if server["state"] == "READY" and server["metrics"]:
            return server
        assert server["state"] not in ("FATAL",), "\n".join(client.logs(NAME, 60)["lines"])
        time.sleep(0.3)
    raise AssertionError(f"{NAME} not READY within {timeout:g}s")


class Load:
    """Requests kept in flight from a thread: long generations, one after another per worker."""

    def __init__(self, url: str, workers: int, prompt_words: int, max_tokens: int):
        self.url, self.stop = url, threading.Event()
        self.body = {"text": "the quick brown fox " * (prompt_words // 4),
                     "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True}}  # fmt: skip
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.post(self.url + "/generate", json=self.body)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


def scheduler_processes(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


async def test_drill_a_stopped_scheduler_reads_stalled_within_5s(drill_fleet):
    _profile, state_dir, client = drill_fleet
    server = wait_ready(client, 120)
    app = ConsoleApp(LiveSource(state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        with Load(server["url"], workers=2, prompt_words=16, max_tokens=200):
            await _stall(pilot, app, client, server)
        await wait_for(
            pilot, lambda: row_cells(app)[NAME]["state"] == "READY", timeout=20, what="READY again"
        )


async def _stall(pilot, app: ConsoleApp, client: SupervisorClient, server: dict) -> None:
    await wait_for(pilot, lambda: (client.server(NAME)["metrics"] or {}).get("in_flight"), timeout=30,
                   what="requests in flight")  # fmt: skip
    children = scheduler_processes(server["pid"])
    for child in children:
        child.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        await wait_for(pilot, lambda: row_cells(app)[NAME]["state"].startswith("STALLED"), timeout=15,
                       what="STALLED on the fleet screen")  # fmt: skip
        seen_after = time.monotonic() - stopped_at
        assert "1 stalled" in status(app)
        await wait_for(pilot, lambda: "STALLED: no scheduler step" in text_of(app, "#fleet-events"),
                       what="the stall in the events pane")  # fmt: skip
    finally:
        for child in children:
            child.send_signal(signal.SIGCONT)
    assert seen_after <= 5.0, f"STALLED shown {seen_after:.1f}s after the scheduler stopped"
    await wait_for(pilot, lambda: row_cells(app)[NAME]["state"] == "READY", timeout=20, what="READY again")


async def test_drill_kv_pressure_fixed_from_the_profile_editor(drill_fleet):
    profile, state_dir, client = drill_fleet
    server = wait_ready(client, 120)
    app = ConsoleApp(LiveSource(state_dir, timeout=2.0), interval=0.5, profile_path=str(profile))
    async with app.run_test(size=SIZE) as pilot:
        with Load(server["url"], workers=4, prompt_words=96, max_tokens=120):
            # The pool is too small: the operator sees it on the fleet screen, red.
            def pressed() -> bool:
                cells = dict(zip((c.key for c in app.screen.shown), app.screen.cells[NAME], strict=True))
                return "red" in str(cells["kv"].style) or "red" in str(cells["preempt"].style)

            await wait_for(pilot, pressed, timeout=60, what="KV pressure drawn red")
        # The fix: a bigger pool in the profile, saved and applied from the console.
        await pilot.press("5")
        editor = app.screen.query_one("TextArea")
        editor.load_text(profile.read_text().replace("max_total_tokens = 256", "max_total_tokens = 2048"))
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: any("ctrl+l applies it: reload will restart drill-0" in str(n.message)
                                          for n in app._notifications), what="the save notice")  # fmt: skip
        old_pid = client.server(NAME)["pid"]
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        assert "drill-0: changed" in app.screen.question
        await pilot.press("y")
        began = time.monotonic()
        deadline = began + 120
        while time.monotonic() < deadline:
            now = client.server(NAME)
            if now["state"] == "READY" and now["pid"] != old_pid:
                break
            await pilot.pause(0.5)
        info = client.info(NAME)
        assert info["max_total_num_tokens"] >= 2048
        events = [e["text"] for e in client.events(300)["events"]]
        assert any("profile reloaded" in t and "max_total_tokens 256 -> 2048" in t for t in events)
