"""What the supervisor and the console say during an incident: a stalled scheduler, errors over the
window, a crash loop, a drain, values that are no longer current. Real supervisor, `supervised_http.py`
servers steered by flag files."""

from __future__ import annotations

import os
import signal
import time

from console.client import SupervisorClient
from console.tui.app import ConsoleApp
from console.tui.live_source import LiveSource
from console.tui.replay_source import ReplaySource
from console.tui.screens.modals import ConfirmScreen
from tests.console.tui_pilot import row_cells, status, text_of, wait_for

SIZE = (170, 40)


def _supervisor_table(fleet, line: str) -> None:
    fleet.profile.write_text(fleet.profile.read_text() + f"\n[supervisor]\n{line}\n")


def _cell(app, server: str, key: str):
    """The cell of column `key` in the server's row, as drawn (text and style)."""
    cells = app.screen.cells[server]
    return next(c for c, col in zip(cells, app.screen.shown, strict=True) if col.key == key)


def _first_event(fleet, server: str, kind: str, since: float) -> dict | None:
    with SupervisorClient(fleet.state_dir) as client:
        events = client.events(600)["events"]
    return next((e for e in events if e["server"] == server and e["kind"] == kind and e["t"] >= since), None)


async def test_stall_errors_crash_loop_and_drain_as_the_operator_sees_them(make_fleet):
    fleet = make_fleet(replicas=3, max_restarts=10)
    _supervisor_table(fleet, "stall_after_s = 1.5\n\n[console.thresholds]\nkv_usage = 0.2")
    fleet.flag(fleet.server(2), "drain_s")
    (fleet.control / f"{fleet.server(2)}.drain_s").write_text("3")
    assert fleet.up().returncode == 0
    stalled, crashing, draining = fleet.server(0), fleet.server(1), fleet.server(2)
    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        # Each waits for what it checks: the rows come from the supervisor's state, their values from its
        # scrapes, which a loaded machine makes later (a check made at once would race the first scrape).
        await wait_for(pilot, lambda: len(row_cells(app)) == 3, what="three rows")
        await wait_for(pilot, lambda: "3 ready" in status(app), what="3 ready counted")
        # The profile's [console.thresholds]: KV at 25% is over its 20%, so drawn red.
        await wait_for(pilot, lambda: _cell(app, stalled, "kv").plain == "25%", what="KV of the first scrape")
        assert "red" in str(_cell(app, stalled, "kv").style)
        # What each server process costs, on the Server screen (the CPU figure needs two samples).
        await wait_for(pilot, lambda: (p := fleet.servers()[stalled]["processes"]) and p[0]["cpu_percent"] is not None,
                       what="process figures")  # fmt: skip
        app.selected = stalled
        await pilot.press("2")
        await wait_for(
            pilot, lambda: "front end" in text_of(app, "#server-processes"), what="processes shown"
        )
        await pilot.press("1")

        # A scheduler that stops stepping while requests are in flight: STALLED within 5 s, in the
        # supervisor's state (and `tokenspeed status`) and on the fleet screen, counted in the header.
        # The 5 s are the supervisor's: from the flag to the stall event it records (its own clock), not
        # to when this loaded test process gets round to seeing the screen change.
        began = time.time()
        fleet.flag(stalled, "stall")
        await wait_for(pilot, lambda: row_cells(app)[stalled]["state"].startswith("STALLED"), timeout=30,
                       what="STALLED on screen")  # fmt: skip
        # The event is noted at the supervisor's next round, which may come just after the screen's answer.
        await wait_for(pilot, lambda: _first_event(fleet, stalled, "stall", began) is not None, what="stall noted")
        stall = _first_event(fleet, stalled, "stall", began)
        assert stall["t"] - began <= 5.0, stall
        await wait_for(pilot, lambda: "1 stalled" in status(app), what="1 stalled counted")
        assert fleet.servers()[stalled]["healthy"] is False
        # Problems first: the stalled server heads the table.
        await wait_for(pilot, lambda: list(app.screen.table.names)[0] == stalled, what="stalled first")
        await wait_for(
            pilot, lambda: "STALLED: no scheduler step" in text_of(app, "#fleet-events"), what="stall event"
        )
        fleet.flag(stalled, "stall", on=False)
        await wait_for(pilot, lambda: row_cells(app)[stalled]["state"] == "READY", what="READY again")

        # Errors over the window: 503 answers counted, drawn red.
        (fleet.control / f"{stalled}.errors").write_text("7")
        await wait_for(pilot, lambda: row_cells(app)[stalled]["errors"] == "7", what="7 errors")
        assert "red" in str(_cell(app, stalled, "errors").style)

        # A crash loop reads as one in the row and the header long before FATAL.
        fleet.flag(crashing, "crash")
        with SupervisorClient(fleet.state_dir) as client:
            client.restart(crashing)
        await wait_for(
            pilot, lambda: "1 crash-looping" in status(app), timeout=30, what="crash-looping counted"
        )
        # BACKOFF x2, STARTING x3, ... (the row and the header are drawn from the same answer, but the loop
        # goes on: each check waits for what it names)
        await wait_for(pilot, lambda: " x" in row_cells(app)[crashing]["state"], what="restarts counted")
        await wait_for(pilot, lambda: "exited unexpectedly (exit code 3)" in text_of(app, "#fleet-events"),
                       what="the exit in the events pane")  # fmt: skip

        # Restart asks with the number of requests in flight and the drain time; the row then drains.
        await pilot.press("escape")
        app.selected = draining
        await wait_for(pilot, lambda: (s := app.snapshot.fleet.server(draining)) and s.in_flight == 4,
                       what="requests in flight scraped")  # fmt: skip
        await pilot.press("R")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        assert "4 request(s) in flight" in app.screen.question and "2 s to finish" in app.screen.question
        await pilot.press("y")
        await wait_for(
            pilot, lambda: row_cells(app)[draining]["state"].startswith("DRAINING"), what="DRAINING"
        )
        await wait_for(pilot, lambda: "1 draining" in status(app), what="1 draining counted")
        await wait_for(pilot, lambda: row_cells(app)[draining]["state"] == "READY", timeout=30, what="back")

        # The supervisor dies (its servers run on): what is on screen is dimmed with its age, never shown
        # as current.
        os.kill(fleet.supervisor_pid(), signal.SIGKILL)
        # (the drained server has just restarted and has no values yet: the first one has)
        await wait_for(pilot, lambda: row_cells(app)[stalled].get("age", "").endswith("old"), timeout=30,
                       what="values marked old")  # fmt: skip
        assert str(_cell(app, stalled, "kv").style) == "dim"
        await wait_for(pilot, lambda: "supervisor unreachable" in status(app), what="unreachable said")

    # The events are kept in the history: a replay shows them.
    replay = ReplaySource(fleet.state_dir)
    try:
        kinds = {(e["server"], e["kind"]) for e in replay.events(600)}
    finally:
        replay.close()
    assert {(stalled, "stall"), (crashing, "exit"), (crashing, "restart"), (draining, "drain")} <= kinds
