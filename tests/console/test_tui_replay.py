"""`tokenspeed console --replay`: a real fleet's recorded state directory, read back after the fleet is gone."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import sqlite3
import time

import pytest

from console.tui.app import ConsoleApp
from console.tui.replay_source import ReplaySource, parse_at
from console.tui.screens.modals import ConfirmScreen
from console.tui.widgets.plot import MetricPlot
from tests.console.tui_pilot import status, table_rows, text_of, wait_for
from tests.console.tui_support import running_fleet

SIZE = (170, 50)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A state directory recorded from a real fleet that lost a server to kill -9, copied after shutdown."""
    out = tmp_path_factory.mktemp("rec") / "state"
    with running_fleet("rep", replicas=2) as fleet:
        time.sleep(2.0)
        os.kill(fleet.server("rep-1")["pid"], signal.SIGKILL)
        fleet.wait(lambda f: f["servers"][1]["restarts"] == 1 and f["servers"][1]["state"] == "READY")
        time.sleep(1.5)
        out.mkdir(parents=True)
        # A consistent copy of the live database (WAL) through SQLite's own backup.
        with (
            sqlite3.connect(fleet.state_dir / "history.sqlite") as src,
            sqlite3.connect(out / "history.sqlite") as dst,
        ):
            src.backup(dst)
        shutil.copy(fleet.state_dir / "state.json", out / "state.json")
        shutil.copytree(fleet.state_dir / "logs", out / "logs")
        shutil.copy(fleet.profile, out.parent / fleet.profile.name)
        state = json.loads((out / "state.json").read_text())
        state["profile_path"] = str(out.parent / fleet.profile.name)
        (out / "state.json").write_text(json.dumps(state))
    return out


def samples(recording, server: str) -> list[tuple[float, dict]]:
    with sqlite3.connect(recording / "history.sqlite") as db:
        rows = db.execute("SELECT t, metrics FROM samples WHERE server = ? ORDER BY t", (server,)).fetchall()
    return [(t, json.loads(m)) for t, m in rows]


async def test_replay_shows_the_fleet_at_the_end_of_the_recording(recording):
    source = ReplaySource(recording)
    app = ConsoleApp(source)
    async with app.run_test(size=SIZE) as pilot:
        rows = await wait_for(pilot, lambda: len(table_rows(app)) == 2 and table_rows(app))
        last_t, last = samples(recording, "rep-0")[-1]
        assert source.now == pytest.approx(
            max(samples(recording, "rep-0")[-1][0], samples(recording, "rep-1")[-1][0])
        )
        assert rows["rep-0"][7] == f"{last['kv_usage'] * 100:.0f}%"
        assert rows["rep-1"][5] == "1"  # the restart after kill -9 is in the recorded state
        assert "REPLAY at" in status(app) and "read-only" in status(app)
        # Replays are read-only whatever the flags say.
        await pilot.press("R", "S")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_replay_moves_through_time(recording):
    history = samples(recording, "rep-0")
    start = history[0][0]
    source = ReplaySource(recording, at=str(start + 1.2))
    app = ConsoleApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(table_rows(app)) == 2)
        expected = [m for t, m in history if t <= source.now][-1]
        assert table_rows(app)["rep-0"][7] == f"{expected['kv_usage'] * 100:.0f}%"
        shown = dt.datetime.fromtimestamp(source.now).strftime("%H:%M:%S")
        assert shown in status(app)
        await pilot.press("right_square_bracket")  # +10 s, clamped at the end
        assert source.now == pytest.approx(min(start + 11.2, source.end))
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert source.now == pytest.approx(source.start)  # clamped at the start of the recording
        await pilot.press("right_square_bracket", "enter")
        assert app.current_mode == "server" and app.selected == "rep-0"
        recorded = [t for t, _ in history if t <= source.now]
        assert recorded
        plot = app.screen.query_one("#plot-kv", MetricPlot)
        # Only what was recorded up to the replay time, not the rest of the recording.
        await wait_for(pilot, lambda: plot._series is not None and len(plot._series) == len(recorded))
        await pilot.press("4")
        await wait_for(
            pilot,
            lambda: "listening on" in "\n".join(s.text for s in app.screen.query_one("#logs-view").lines),
        )
        await pilot.press("3")
        await wait_for(
            pilot, lambda: "replay" in text_of(app, "#experts-title"), what="experts explain replay"
        )


def test_parse_at_forms():
    start, end = 1_000_000.0, 1_000_600.0
    assert parse_at(None, start, end) == end
    assert parse_at("-5m", start, end) == end - 300
    assert parse_at("-30", start, end) == end - 30
    assert parse_at("1000100.5", start, end) == 1_000_100.5
    iso = dt.datetime(2026, 1, 31, 10, 30, tzinfo=dt.UTC)
    assert parse_at(iso.isoformat(), start, end) == iso.timestamp()
    day = dt.datetime.fromtimestamp(end).date()
    assert parse_at("10:30:00", start, end) == dt.datetime.combine(day, dt.time(10, 30)).timestamp()
    with pytest.raises(ValueError, match="--at"):
        parse_at("yesterday", start, end)


def test_replay_of_a_directory_without_history_names_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--replay"):
        ReplaySource(tmp_path)
