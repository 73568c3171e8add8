"""The log screen's lines as the terminal shows them: nothing drawn beside a line that is not part of it.

Over a recorded fleet (a replay: the same lines on every run, so the scrollbar thumb always lands where it
did when Textual drew a `▂▂` at the right edge of a log line).
"""

from __future__ import annotations

import time

import pytest

from tests.console.test_tui_snapshots import T0, loaded, replay_app, write_recording
from tests.console.tui_pilot import EIGHTH_BLOCKS, log_lines, screen_lines, text_of, wait_for

LOG_LINES = 500


@pytest.fixture(scope="module")
def long_log_recording(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges") / "rec"
    write_recording(root)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0))
    lines = [f"{stamp} INFO scheduler: step {i}: batch 3 tokens {40 + i}" for i in range(LOG_LINES)]
    (root / "logs" / "demo-0.log").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("size", [(200, 55), (80, 24)])
async def test_log_lines_have_no_stray_glyph_at_their_right_edge(long_log_recording, size):
    app = replay_app(long_log_recording)
    async with app.run_test(size=size) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        await wait_for(pilot, lambda: len(log_lines(app)) == LOG_LINES, what="the whole log")
        await pilot.pause(0.3)
        lines = screen_lines(app)
        assert len(lines) == size[1]
        assert sum("scheduler: step" in line for line in lines) > size[1] // 2  # the log fills the screen
        # Followed to its end, with a scrollbar beside it; no eighth block anywhere (nothing else draws one).
        assert any(f"step {LOG_LINES - 1}:" in line for line in lines)
        assert not [line for line in lines if EIGHTH_BLOCKS & set(line)], "\n".join(lines)


async def test_supervisor_notes_are_not_taken_for_the_error_above_them(tmp_path):
    """A line without a level continues the one above (a traceback's frames stay with it), but the
    supervisor's own notes are never the server's output: at level ERROR the frame shows, the note not."""
    root = tmp_path / "rec"
    write_recording(root)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0))
    (root / "logs" / "demo-0.log").write_text(
        f"{stamp} INFO scheduler: step 1\n"
        f"{stamp} ERROR scheduler: the step failed\n"
        '  File "model_runner.py", line 12, in forward\n'
        f"[supervisor {stamp}] demo-0: experts rebalanced (rebalance #1)\n"
        f"[supervisor {stamp}] demo-0: FATAL: refused: no GPU fits\n"
    )
    app = replay_app(root)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        await wait_for(pilot, lambda: len(log_lines(app)) == 5, what="the whole log")
        await pilot.press("v", "v", "v")  # DEBUG -> INFO -> WARNING -> ERROR
        await wait_for(pilot, lambda: len(log_lines(app)) == 3, what="the ERROR lines")
        lines = log_lines(app)
        assert any("the step failed" in line for line in lines)
        assert any("model_runner.py" in line for line in lines)
        assert any("FATAL: refused" in line for line in lines)
        assert not any("experts rebalanced" in line for line in lines)


async def test_w_wraps_a_long_line_to_the_screen_instead_of_cutting_it(tmp_path):
    """A line wider than the screen is cut at its edge, as k9s shows it; `w` wraps it so all of it shows."""
    root = tmp_path / "rec"
    write_recording(root)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0))
    long_line = f"{stamp} ERROR serve: " + "the prompt does not fit " * 12 + "ask for at most 511 END-OF-LINE"
    (root / "logs" / "demo-0.log").write_text(f"{stamp} INFO scheduler: step 1\n{long_line}\n")
    app = replay_app(root)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        await wait_for(pilot, lambda: len(log_lines(app)) == 2, what="the whole log")
        await pilot.pause(0.3)
        assert not any("END-OF-LINE" in line for line in screen_lines(app))
        assert "wrap off" in text_of(app, "#logs-title")
        await pilot.press("w")
        await wait_for(
            pilot, lambda: any("END-OF-LINE" in line for line in screen_lines(app)), what="wrapped"
        )
        assert "wrap on" in text_of(app, "#logs-title")
        assert any("step 1" in line for line in screen_lines(app))  # the line before it is still there
        await pilot.press("w")
        await wait_for(
            pilot, lambda: not any("END-OF-LINE" in line for line in screen_lines(app)), what="cut"
        )
