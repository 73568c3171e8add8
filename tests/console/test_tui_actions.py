"""Console actions against a real fleet: what the operator confirms happens to real processes."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import psutil

from console.client import SupervisorClient
from console.supervisor.paths import default_state_dir
from console.tui.app import ConsoleApp
from console.tui.launch import OpenedSource
from console.tui.screens.modals import ConfirmScreen, LeaveScreen
from tests.console import tui_pilot
from tests.console.tui_pilot import row_order, status, table_rows, text_of, wait_for, wait_for_rows
from tests.console.tui_support import fleet_fixture, free_base_port, make_app, running_fleet, write_profile

SIZE = (170, 50)


fleet = fleet_fixture("act")


async def select(pilot, app: ConsoleApp, name: str) -> None:
    await wait_for_rows(pilot, app, 3)
    order = row_order(app)
    await pilot.press("home", *["down"] * order.index(name))
    assert app.selected == name


def pid_of(fleet, name: str) -> int:
    return fleet.server(name)["pid"]


def gone(pid: int) -> bool:
    """The process has ended (a zombie its parent has not reaped yet counts)."""
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def asked(pilot, app: ConsoleApp, key: str) -> str:
    """The question `key` asks before acting (it must ask, and show all of it)."""
    await pilot.press(key)
    assert isinstance(app.screen, ConfirmScreen)
    await pilot.pause()
    # the dialog's lines between its borders, words only: a question wider than the dialog wraps, never cut
    inside = [
        line[line.index("█") + 1 : line.rindex("█")]
        for line in tui_pilot.screen_lines(app)
        if line.count("█") >= 2
    ]
    drawn = " ".join(" ".join(inside).split())
    assert " ".join(app.screen.question.split()) in drawn, f"the dialog cuts its question:\n{drawn}"
    return app.screen.question


def log_of(fleet, name: str) -> str:
    return "\n".join(fleet.client.logs(name, 200)["lines"])


async def test_restart_asks_first_and_cancel_leaves_the_server_alone(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "act-1")
        before = pid_of(fleet, "act-1")
        assert "Restart act-1?" in await asked(pilot, app, "R")
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.pause(1.0)
        assert pid_of(fleet, "act-1") == before
        await pilot.press("R", "y")
        fleet.wait(
            lambda f: next(s for s in f["servers"] if s["name"] == "act-1")["pid"] not in (before, None)
        )
        fleet.wait_ready()
        assert gone(before)
        await wait_for(pilot, lambda: table_rows(app)["act-1"][3] == "READY", what="READY again on screen")


async def test_stop_then_start(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "act-2")
        pid = pid_of(fleet, "act-2")
        await asked(pilot, app, "S")
        await pilot.press("y")
        await wait_for(pilot, lambda: table_rows(app)["act-2"][3] == "STOPPED", what="STOPPED on screen")
        assert gone(pid)
        assert "2 ready" in status(app)
        await pilot.press("s")  # start needs no confirmation
        await wait_for(pilot, lambda: table_rows(app)["act-2"][3] == "READY", what="READY after start")
        fleet.wait_ready()


async def test_marked_servers_get_the_action_flush_cache(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "act-0")
        await pilot.press("space", "space")  # marks act-0 and act-1 (the cursor moves down)
        assert app.marked == {"act-0", "act-1"}
        assert "2 marked" in status(app)
        assert table_rows(app)["act-0"][0].startswith("● ")
        await pilot.press("F")
        for name in ("act-0", "act-1"):
            fleet.wait(lambda f, n=name: "prefix cache flushed" in log_of(fleet, n), what=f"flush on {name}")
        assert "prefix cache flushed" not in log_of(fleet, "act-2")
        await wait_for(pilot, lambda: not app.marked, what="marks cleared after the action")


async def test_expert_recording_start_and_stop(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "act-0")
        await pilot.press("X")
        fleet.wait(lambda f: "recording stopped" in log_of(fleet, "act-0"), what="recording stopped")
        assert "tokenspeed:expert_load" in fleet.client.raw_metrics("act-0")
        await pilot.press("x")
        fleet.wait(lambda f: "recording started" in log_of(fleet, "act-0"), what="recording started")


async def test_rolling_restart_replaces_every_process(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        before = {s["name"]: s["pid"] for s in fleet.servers()}
        await asked(pilot, app, "ctrl+r")
        await pilot.press("y")

        def all_replaced(f):
            return all(
                s["pid"] not in (before[s["name"]], None) and s["state"] == "READY" for s in f["servers"]
            )

        fleet.wait(all_replaced, timeout=30, what="every server restarted")


async def test_killed_server_shows_its_restart(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        restarts = fleet.server("act-2")["restarts"]
        os.kill(pid_of(fleet, "act-2"), signal.SIGKILL)
        await wait_for(
            pilot, lambda: table_rows(app)["act-2"][5] == str(restarts + 1), what="restart counted on screen"
        )
        await wait_for(pilot, lambda: table_rows(app)["act-2"][3] == "READY", what="READY again")
        await select(pilot, app, "act-2")
        assert "signal" in text_of(app, "#fleet-detail")  # last exit: signal 9


async def test_readonly_turns_every_action_off(fleet):
    app = make_app(fleet, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "act-0")
        pids = {s["name"]: s["pid"] for s in fleet.servers()}
        await pilot.press("R", "S", "ctrl+r", "F", "X")
        assert not isinstance(app.screen, ConfirmScreen)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not any("Restart" in t or "Stop" in t for t in titles)
        assert "read-only" in status(app)
        await pilot.pause(1.0)
        assert {s["name"]: s["pid"] for s in fleet.servers()} == pids
        assert all(s["state"] == "READY" for s in fleet.servers())
        assert "recording stopped" not in log_of(fleet, "act-0").split("recording started")[-1]


async def test_leaving_a_console_that_started_the_fleet_asks_and_can_stop_it():
    with running_fleet("leave", replicas=1) as small:
        app = make_app(small, started_fleet=True)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("q")
            assert isinstance(app.screen, LeaveScreen)
            await pilot.press("escape")  # stay
            assert not isinstance(app.screen, LeaveScreen) and app.is_running
            await pilot.press("q", "s")
        assert app.stop_fleet_on_exit
        pid = small.server("leave-0")["pid"]
        # What `tokenspeed console PROFILE` does after the app exits with that answer.
        opened = OpenedSource(app.source, started_fleet=True, profile_path=None, state_dir=small.state_dir)
        assert opened.stop_fleet(timeout=30)
        app.source.close()
        assert not small.client.alive()
        assert gone(pid)


async def test_leaving_a_console_that_only_attached_never_asks(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
    assert not app.stop_fleet_on_exit
    assert fleet.client.alive()


async def test_profile_screen_launches_a_new_fleet(fleet, tmp_path, monkeypatch):
    # The new fleet's supervisor lives under XDG_STATE_HOME (a short path: the socket must fit).

    from tests.console.tui_pilot import text_of

    state_home = tempfile.mkdtemp(prefix="tsx-")
    monkeypatch.setenv("XDG_STATE_HOME", state_home)
    profile = write_profile(tmp_path, "fresh", replicas=1, base_port=free_base_port(1))
    app = make_app(fleet, profile_path=str(profile))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await wait_for(pilot, lambda: "valid, 1 server(s)" in text_of(app, "#profile-errors"))
        await pilot.press("ctrl+l")
        client = SupervisorClient(default_state_dir("fresh"), timeout=2.0)
        try:
            await wait_for(pilot, client.alive, what="the launched fleet's supervisor", timeout=30)
            await wait_for(
                pilot,
                lambda: client.fleet()["servers"][0]["state"] == "READY",
                what="fresh-0 READY",
                timeout=30,
            )
            await pilot.press("ctrl+l")  # a second launch finds it running and starts nothing
            await pilot.pause(0.5)
            assert len(client.fleet()["servers"]) == 1
        finally:
            if client.alive():
                pid = client.fleet()["servers"][0]["pid"]
                client.shutdown()
                psutil.wait_procs([psutil.Process(pid)], timeout=20) if psutil.pid_exists(pid) else None
            client.close()
            shutil.rmtree(state_home, ignore_errors=True)


async def test_a_frozen_server_is_shown_failing_and_the_rest_keep_updating(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        pid = pid_of(fleet, "act-1")
        os.kill(pid, signal.SIGSTOP)  # alive but answering nothing: health checks time out
        try:
            await wait_for(
                pilot, lambda: table_rows(app)["act-1"][3].startswith("UNHEALTHY"), what="UNHEALTHY row"
            )
            assert "1 failing" in status(app)
            polls = app.poller.state.polls
            await wait_for(pilot, lambda: app.poller.state.polls > polls + 2, what="polling goes on")
            assert table_rows(app)["act-0"][3] == "READY"
        finally:
            os.kill(pid, signal.SIGCONT)
        fleet.wait_ready()
        await wait_for(pilot, lambda: "failing" not in status(app), what="recovered")


def test_every_action_the_console_offers_has_a_supervisor_route():
    # The app's verbs (what an operator reads and whether it asks first) and the client's routes are two
    # tables keyed by the same action names: an action in one only would do nothing, or never be offered.
    from console.client import SERVER_ROUTES
    from console.tui.app import SERVER_ACTIONS

    assert set(SERVER_ACTIONS) == set(SERVER_ROUTES)
