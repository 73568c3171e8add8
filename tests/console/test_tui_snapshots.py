"""SVG snapshots of the main console screens over a deterministic recording (a replay).

The recording is written with the supervisor's own history writer, so it has exactly the layout a
real fleet leaves behind; its numbers are fixed functions of time. Update after a deliberate
change of the UI with `pytest tests/console/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import io
import json
import math
import re
import sqlite3
import time
from pathlib import Path

import pytest
from rich.console import Console

from console.supervisor.history import MetricsHistory
from console.tui.app import ConsoleApp
from console.tui.replay_source import ReplaySource
from tests.console.tui_pilot import table_rows

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
SECONDS = 180
NODES = ("node-a", "node-b")
SIZE = (150, 40)


def write_recording(root: Path) -> None:
    """A 6-server, 2-node fleet: one server crash-looped to FATAL, one stopped reporting 20 s ago."""
    (root / "logs").mkdir(parents=True)
    servers = []
    for i in range(6):
        servers.append(
            {
                "name": f"demo-{i}",
                "replica": i,
                "node": NODES[i % 2],
                "gpus": [2 * (i // 2), 2 * (i // 2) + 1],
                "host": "127.0.0.1",
                "port": 30000 + 10 * i,
                "url": f"http://127.0.0.1:{30000 + 10 * i}",
                "restarts": 5 if i == 4 else (1 if i == 1 else 0),
                "started_at": T0 + (40 if i == 1 else 0),
                "last_exit": {"code": None, "signal": 9, "at": T0 + 39} if i == 1 else None,
            }
        )
    (root / "state.json").write_text(json.dumps({"fleet": "demo", "started_at": T0, "servers": servers}))
    # The supervisor's writer creates the database; the rows go in as one transaction (fast).
    MetricsHistory(root / "history.sqlite", retention_s=1e9).close()
    rows = []
    for second in range(SECONDS):
        for i in range(6):
            if i == 4 and second > 30:  # crash loop: no scrapes after 30 s
                continue
            if i == 5 and second > SECONDS - 20:  # unreachable for the last 20 s
                continue
            rows.append((f"demo-{i}", T0 + second, json.dumps(metrics_at(i, second))))
    with sqlite3.connect(root / "history.sqlite") as db:
        db.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows)
    lines = []
    for second in range(0, 60, 3):
        level = "ERROR" if second % 27 == 0 else ("WARNING" if second % 9 == 0 else "INFO")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + second))
        lines.append(f"{stamp} {level} scheduler: step {second}: batch {second % 7 + 1} tokens {40 + second}")
    (root / "logs" / "demo-0.log").write_text("\n".join(lines) + "\n")


def metrics_at(i: int, second: int) -> dict:
    return {
        "running": float(2 + i % 3),
        "waiting": float((second // 10 + i) % 4),
        "kv_usage": round(0.35 + 0.3 * math.sin(second / 20 + i), 4),
        "prefix_hit_rate": round(0.5 + 0.05 * i, 3),
        "gen_throughput": round(120 + 15 * i + 30 * math.sin(second / 15), 2),
        "ttft_p50": 0.04 + 0.005 * i,
        "ttft_p99": 0.2 + 0.02 * i + 0.05 * math.sin(second / 30) ** 2,
        "itl_p50": 0.012 + 0.001 * i,
        "itl_p99": 0.05 + 0.004 * i,
        "queue_p50": 0.002 + 0.001 * i,
        "queue_p99": 0.03 + 0.01 * i + 0.02 * math.sin(second / 25) ** 2,
        "requests_total": float(second * (3 + i)),
        "errors_total": float(second // 60 if i == 2 else 0),
    }


@pytest.fixture(scope="module")
def recording_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("snap")
    write_recording(root / "rec")
    return root


@pytest.fixture
def recorded(recording_dir, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    # A relative path, so the header (which names the directory) is the same on every machine.
    monkeypatch.chdir(recording_dir)
    yield Path("rec")
    monkeypatch.delenv("TZ")
    time.tzset()


def replay_app(path: Path) -> ConsoleApp:
    return ConsoleApp(ReplaySource(path, at=str(T0 + SECONDS - 1)))


async def loaded(pilot) -> None:
    app = pilot.app
    for _ in range(100):
        if len(table_rows(app)) == 6:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.3)


def pressing(*keys: str, settle: float = 0.3):
    """A `run_before` that waits for the recording's rows, presses `keys` and lets the screen settle."""

    async def run_before(pilot) -> None:
        await loaded(pilot)
        await pilot.press(*keys)
        await pilot.pause(settle)

    return run_before


def test_fleet_screen_snapshot(recorded, snap_compare):
    assert snap_compare(replay_app(recorded), terminal_size=SIZE, run_before=loaded)


def test_fleet_screen_filtered_and_sorted_snapshot(recorded, snap_compare):
    run_before = pressing("slash", *"node-b", "enter", "K")  # shift+k: sort by KV usage
    assert snap_compare(replay_app(recorded), terminal_size=SIZE, run_before=run_before)


def test_fleet_screen_80x24_snapshot(recorded, snap_compare):
    """A small terminal keeps what an operator needs first: state, queue, KV, tokens/s, TTFT, errors."""
    shown: list[str] = []

    async def run_before(pilot):
        await loaded(pilot)
        shown.extend(c.key for c in pilot.app.screen.shown)

    assert snap_compare(replay_app(recorded), terminal_size=(80, 24), run_before=run_before)
    assert {"name", "state", "queue", "kv", "tps", "ttft", "errors"} <= set(shown)
    assert "node" not in shown and "gpus" not in shown  # the first to go


def test_server_screen_snapshot(recorded, snap_compare):
    run_before = pressing("enter", settle=0.8)
    assert snap_compare(replay_app(recorded), terminal_size=SIZE, run_before=run_before)


def test_logs_screen_snapshot(recorded, snap_compare):
    run_before = pressing("4", "v", settle=0.8)  # INFO and up
    assert snap_compare(replay_app(recorded), terminal_size=SIZE, run_before=run_before)


def test_help_snapshot(recorded, snap_compare):
    assert snap_compare(replay_app(recorded), terminal_size=SIZE, run_before=pressing("question_mark"))


async def test_cursor_row_stands_out_in_256_colours(recorded):
    """In a 256-colour terminal (tmux's default) the cursor row has a marker and a background of its own,
    which the cells' colours do not cover."""
    app = replay_app(recorded)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("down")
        await pilot.pause(0.2)
        console = Console(width=80, file=io.StringIO(), record=True, color_system="256", force_terminal=True)
        console.print(app.screen._compositor.render_update(full=True))
        lines = console.export_text(styles=True).splitlines()
    # The first three table rows; the second is the cursor's.
    rows = [line for line in lines if "demo-" in line][:3]
    backgrounds = [set(re.findall(r"48;5;(\d+)", row)) for row in rows]
    assert "▶" in rows[1] and "▶" not in rows[0] + rows[2]
    assert len(backgrounds[1]) == 1  # one background across the whole cursor row, coloured cells included
    assert backgrounds[1].isdisjoint(backgrounds[0] | backgrounds[2])
