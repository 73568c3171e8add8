"""The metrics history records each server's process state, and replay shows it: a crash loop is visible.

A real supervisor runs two `supervised_http.py` servers; one is killed and then crashes at every start,
through BACKOFF into FATAL. The history must hold those states (with restarts, pid and start time) and
`ReplaySource` must show them at the recorded moments, while an older history without the state table
still replays the way it always did.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time

import pytest

from console.supervisor.history import MetricsHistory
from console.tui.replay_source import ReplaySource


@pytest.fixture
def crashed(make_fleet):
    """A stopped fleet's state directory: server 1 READY, then killed into a crash loop until FATAL."""
    fleet = make_fleet(replicas=2, max_restarts=2)
    bad, good = fleet.server(1), fleet.server(0)
    assert fleet.up().returncode == 0
    first = fleet.wait_for(
        lambda s: all(x["state"] == "READY" and x["metrics"] for x in s.values()), what="both READY"
    )
    time.sleep(1.2)  # a few READY samples of both servers
    fleet.flag(bad, "crash")
    killed_at = time.time()
    os.kill(first[bad]["pid"], signal.SIGKILL)
    fleet.wait_for(lambda s: s[bad]["state"] == "FATAL", what="the crash loop to go FATAL")
    time.sleep(1.2)  # a few FATAL status rows
    assert fleet.cli("down", "--timeout", "10").returncode == 0
    return fleet, bad, good, first, killed_at


def statuses(state_dir, server: str) -> list:
    history = MetricsHistory(state_dir / "history.sqlite", retention_s=1e9)
    try:
        return history.statuses(server, 0.0)
    finally:
        history.close()


def first_time(rows: list, state: str) -> float:
    return next(t for t, status in rows if status.state == state)


def test_crash_loop_states_are_recorded_and_replayed(crashed):
    fleet, bad, good, first, killed_at = crashed
    rows = statuses(fleet.state_dir, bad)
    states = [status.state for _, status in rows]
    assert {"READY", "BACKOFF", "FATAL"} <= set(states), states
    # In order: READY before the kill, BACKOFF between restarts, then FATAL for good.
    assert states.index("READY") < states.index("BACKOFF") < states.index("FATAL")
    ready = next(status for _, status in rows if status.state == "READY")
    assert ready.pid == first[bad]["pid"] and ready.restarts == 0
    assert ready.started_at == pytest.approx(first[bad]["started_at"], abs=1e-3)
    fatal = [status for _, status in rows if status.state == "FATAL"]
    assert all(s.pid is None and s.started_at is None and s.restarts == 2 for s in fatal)
    assert len(fatal) >= 2  # recorded at every round while FATAL, not only at the change

    # The round right after the kill may still say READY (the exit is not reaped yet) with a failed
    # scrape; replay must show that moment as it was, so the READY-with-metrics check uses one before it.
    t_ready = max(t for t, status in rows if status.state == "READY" and t < killed_at)
    t_backoff = first_time(rows, "BACKOFF")
    t_fatal = first_time(rows, "FATAL") + 0.5

    def at(t: float) -> dict:
        source = ReplaySource(fleet.state_dir, at=str(t))
        try:
            return {s.name: s for s in source.fleet().servers}
        finally:
            source.close()

    before = at(t_ready)
    assert before[bad].state == "READY" and before[bad].healthy
    assert before[bad].pid == first[bad]["pid"] and before[bad].restarts == 0
    assert before[bad].metrics is not None
    assert before[bad].uptime_s == pytest.approx(t_ready - first[bad]["started_at"], abs=0.01)

    backing_off = at(t_backoff)[bad]
    assert backing_off.state == "BACKOFF" and not backing_off.healthy
    assert backing_off.pid is None and backing_off.metrics is None and backing_off.restarts >= 1

    during = at(t_fatal)
    assert during[bad].state == "FATAL" and during[bad].restarts == 2
    assert during[bad].pid is None and during[bad].metrics is None and during[bad].uptime_s is None
    # The healthy server kept serving through the incident, with its own process and metrics.
    assert during[good].state == "READY" and during[good].restarts == 0
    assert during[good].pid == first[good]["pid"] and during[good].metrics is not None


def test_history_without_the_state_table_still_replays(crashed, tmp_path):
    fleet, bad, good, _, _ = crashed
    t_fatal = first_time(statuses(fleet.state_dir, bad), "FATAL") + 0.5
    old = tmp_path / "old"
    shutil.copytree(fleet.state_dir, old, ignore=shutil.ignore_patterns("*.sock"))
    with sqlite3.connect(old / "history.sqlite") as db:
        db.execute("DROP TABLE statuses")
    source = ReplaySource(old, at=str(t_fatal))
    try:
        servers = {s.name: s for s in source.fleet().servers}
    finally:
        source.close()
    # Without states, replay can only guess READY or STOPPED from the metrics samples near that time.
    assert servers[bad].state in ("READY", "STOPPED")
    assert servers[bad].restarts == 2  # from the final state.json, as before
    assert servers[good].state == "READY" and servers[good].metrics is not None
    # The writer upgrades an older file in place: the state table is added, the samples kept.
    with sqlite3.connect(old / "history.sqlite") as db:
        (count,) = db.execute("SELECT COUNT(*) FROM samples").fetchone()
    assert count > 0
    MetricsHistory(old / "history.sqlite", retention_s=1e9).close()
    with sqlite3.connect(old / "history.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM statuses").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (count,)
