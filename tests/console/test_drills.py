"""Incident drills: the real console (pilot, and once a real terminal) over a real supervised fleet of
`tokenspeed serve` processes (tests/console/drill_fleet.py), a fault injected, and what the operator must
see within a deadline, then the fix taking effect.

- a scheduler that stops (SIGSTOP) while requests are in flight: the row reads STALLED within 5 s, the
  header counts it, the events pane says so; it recovers when the scheduler runs again.
- KV pressure (a 256-token pool, long prompts): KV and preemptions drawn red; the operator raises
  `max_total_tokens` in the profile editor, saves (the notice says what applying will do), applies
  (`ctrl+l`, the confirmation lists the change) and the server comes back with the new pool.
- crash loop (the server's weights file truncated, the process killed): the row leaves READY for BACKOFF
  within seconds and the header counts a crash loop; Home + `4` show the SafetensorError in its log; the
  file restored, `R y` brings it back READY.
- expert imbalance (one token repeated, so the router sends everything to the same experts): the fleet
  row's BALANCE cell is drawn red; `3` names the hottest expert and the EP rank serving it; `B y`
  rebalances and the balancedness rises, the screen listing the experts that changed rank.
- server lost (kill -9), in tmux: the row leaves READY within seconds, the detail line says SIGKILL, and
  the supervisor brings it back READY with no key pressed.

Deadlines are generous for a loaded CI machine; the times measured are what DrillLog records.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time

import httpx
import psutil
import pytest

from console.tui.app import ConsoleApp
from console.tui.screens.modals import ConfirmScreen
from tests.console.drill_fleet import (
    COPY,
    MAIN,
    MOE,
    DrillLog,
    Load,
    drill_fleet,
    lopsided_prompt,
    wait_ready,
)
from tests.console.tui_pilot import log_lines, row_cells, row_order, status, text_of, wait_for
from tests.console.tui_support import make_app

SIZE = (170, 45)


@pytest.fixture(scope="module")
def drill_log():
    log = DrillLog()
    yield log
    log.write(os.environ.get("TOKENSPEED_DRILL_TIMES"))


@pytest.fixture(scope="module")
def fleet():
    with drill_fleet() as fleet:
        yield fleet


def cell_style(app: ConsoleApp, name: str, key: str) -> str:
    cells = dict(zip((c.key for c in app.screen.shown), app.screen.cells[name], strict=True))
    return str(cells[key].style)


async def press(pilot, keys: list[str], *pressed: str) -> None:
    """Press keys as the operator does, counting them in `keys`."""
    keys.extend(pressed)
    await pilot.press(*pressed)


async def test_drill_kv_pressure_fixed_from_the_profile_editor(fleet, drill_log):
    # First of the drills: the server has seen no load yet, so the red cells are this drill's own.
    profile, client = fleet.profile, fleet.client
    server = wait_ready(client, MAIN, 120)
    app = make_app(fleet, profile_path=str(profile))
    async with app.run_test(size=SIZE) as pilot:
        drill = drill_log.start("KV pressure", "4 clients of 96-word prompts on a 256-token KV pool")
        with Load.text(server["url"], workers=4, prompt_words=96, max_tokens=120):
            # The pool is too small: the operator sees it on the fleet screen, red.
            def pressed() -> bool:
                return "red" in cell_style(app, MAIN, "kv") or "red" in cell_style(app, MAIN, "preempt")

            await wait_for(pilot, pressed, timeout=60, what="KV pressure drawn red")
            drill.saw("KV or PREEMPT red on the fleet row", diagnosis=True)
        # The fix: a bigger pool in the profile, saved and applied from the console.
        await press(pilot, drill.fix_keys, "5")
        editor = app.screen.query_one("TextArea")
        editor.load_text(profile.read_text().replace("max_total_tokens = 256", "max_total_tokens = 2048"))
        drill.fix_keys.append("(edit 256 -> 2048: 4 keys)")
        await press(pilot, drill.fix_keys, "ctrl+s")
        await wait_for(pilot, lambda: any(f"ctrl+l applies it: reload will restart {MAIN}" in str(n.message)
                                          for n in app._notifications), what="the save notice")  # fmt: skip
        old_pid = client.server(MAIN)["pid"]
        await press(pilot, drill.fix_keys, "ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        assert f"{MAIN}: changed" in app.screen.question
        assert f"{COPY}: changed" not in app.screen.question and f"{MOE}: changed" not in app.screen.question
        await press(pilot, drill.fix_keys, "y")
        applied = time.monotonic()
        wait_ready(client, MAIN, 180, other_than=old_pid)
        drill.fix_effect_s = round(time.monotonic() - applied, 2)
        info = client.info(MAIN)
        assert info["max_total_num_tokens"] >= 2048
        events = [e["text"] for e in client.events(300)["events"]]
        assert any("profile reloaded" in t and "max_total_tokens 256 -> 2048" in t for t in events)


async def test_drill_a_stopped_scheduler_reads_stalled_within_5s(fleet, drill_log):
    client = fleet.client
    server = wait_ready(client, MAIN, 120)
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        with Load.text(server["url"], workers=2, prompt_words=16, max_tokens=200):
            await wait_for(pilot, lambda: (client.server(MAIN)["metrics"] or {}).get("in_flight"),
                           timeout=30, what="requests in flight")  # fmt: skip
            children = psutil.Process(server["pid"]).children(recursive=True)
            drill = drill_log.start("slow TTFT / stalled scheduler", "SIGSTOP of the scheduler processes")
            for child in children:
                child.send_signal(signal.SIGSTOP)
            try:
                await wait_for(pilot, lambda: row_cells(app)[MAIN]["state"].startswith("STALLED"),
                               timeout=15, what="STALLED on the fleet screen")  # fmt: skip
                seen_after = drill.saw("row STALLED")
                assert "1 stalled" in status(app)
                await wait_for(pilot, lambda: "STALLED: no scheduler step" in text_of(app, "#fleet-events"),
                               what="the stall in the events pane")  # fmt: skip
                drill.saw("events pane: no scheduler step", diagnosis=True)
            finally:
                for child in children:
                    child.send_signal(signal.SIGCONT)
            resumed = time.monotonic()
        assert seen_after <= 5.0, f"STALLED shown {seen_after:.1f}s after the scheduler stopped"
        await wait_for(pilot, lambda: row_cells(app)[MAIN]["state"] == "READY", timeout=20, what="READY again")
        drill.fix_keys = ["(none: SIGCONT)"]
        drill.fix_effect_s = round(time.monotonic() - resumed, 2)


async def test_drill_crash_loop_from_truncated_weights(fleet, drill_log):
    client = fleet.client
    server = wait_ready(client, COPY, 120)
    weights = next(fleet.copy_model.glob("*.safetensors"))
    good = weights.read_bytes()
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: row_cells(app)[COPY]["state"] == "READY", what="READY row")
        drill = drill_log.start("crash loop", "weights file truncated to half, then the server killed")
        try:
            weights.write_bytes(good[: len(good) // 2])
            os.kill(server["pid"], signal.SIGKILL)
            await wait_for(pilot, lambda: row_cells(app)[COPY]["state"] != "READY", timeout=15,
                           what="the row leaving READY")  # fmt: skip
            drill.saw("row left READY")
            # Diagnosis: problems first puts the server on top; Home selects it: the detail line gives the
            # exit of the failed start, and 4 opens its log with the reason.
            await wait_for(pilot, lambda: row_order(app)[0] == COPY, what="the broken server on top")
            await press(pilot, drill.diagnosis_keys, "home")
            await wait_for(pilot, lambda: re.search(rf"^{COPY} .*last exit: exit \d+", text_of(app, "#fleet-detail")),
                           timeout=120, what="the failed start's exit on the detail line")  # fmt: skip
            drill.saw("detail: last exit code of a failed start")
            await press(pilot, drill.diagnosis_keys, "4")
            await wait_for(pilot, lambda: any("SafetensorError" in line for line in log_lines(app)),
                           timeout=30, what="the SafetensorError in the server's log")  # fmt: skip
            drill.saw("log: SafetensorError", diagnosis=True)
            await press(pilot, [], "1")  # back to the fleet screen (not needed for the diagnosis)
            await wait_for(pilot, lambda: "1 crash-looping" in status(app), timeout=120,
                           what="the header counting a crash loop")  # fmt: skip
            drill.saw("header: 1 crash-looping")
            assert re.match(r"(BACKOFF|STARTING) x\d", row_cells(app)[COPY]["state"]), row_cells(app)[COPY]
        finally:
            weights.write_bytes(good)
        await press(pilot, drill.fix_keys, "R")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        assert f"Restart {COPY}?" in app.screen.question
        await press(pilot, drill.fix_keys, "y")
        fixed = time.monotonic()
        await wait_for(pilot, lambda: row_cells(app)[COPY]["state"] == "READY", timeout=180,
                       what="READY after the fix")  # fmt: skip
        drill.fix_effect_s = round(time.monotonic() - fixed, 2)
        assert "crash-looping" not in status(app)


async def test_drill_expert_imbalance_rebalanced_from_the_experts_screen(fleet, drill_log):
    client = fleet.client
    url = wait_ready(client, MOE, 120)["url"]
    prompt, _ = lopsided_prompt(url, fleet.root / "dumps")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: row_cells(app)[MOE]["state"] == "READY", what="READY row")
        # the window restarts: what the console shows from here on is the drill's traffic alone
        httpx.post(url + "/start_expert_distribution_record", timeout=30, trust_env=False).raise_for_status()
        await wait_for(pilot, lambda: "red" not in cell_style(app, MOE, "bal"), timeout=30,
                       what="BALANCE not red once the window restarted")  # fmt: skip
        drill = drill_log.start("expert imbalance", f"traffic of one token repeated ({prompt[0]} x 48)")
        with Load(url, workers=1, body=body):
            await wait_for(pilot, lambda: "red" in cell_style(app, MOE, "bal"), timeout=30,
                           what="the BALANCE cell drawn red")  # fmt: skip
            drill.saw("fleet row: BALANCE red")
            before = float(row_cells(app)[MOE]["bal"])
            # Diagnosis: the cursor to the MoE row (READY rows keep their order), then the Experts screen.
            for _ in range(4):
                if app.selected == MOE:
                    break
                await press(pilot, drill.diagnosis_keys, "down")
            assert app.selected == MOE
            await press(pilot, drill.diagnosis_keys, "3")
            hot = re.compile(r"layer +(\d+) +expert +(\d+) +\d+% of the layer's tokens +on ranks? ([\d,]+)")
            where = await wait_for(pilot, lambda: hot.search(text_of(app, "#experts-ranks")), timeout=30,
                                   what="the hottest expert and its rank")  # fmt: skip
            drill.saw("Experts: hottest expert and its rank", diagnosis=True)
            assert "placement (logical expert in each slot" in text_of(app, "#experts-ranks")
            layer, expert, ranks = int(where.group(1)), int(where.group(2)), where.group(3)
            placement = client.expert_placement(MOE)
            row = placement["phy2log"][placement["layers"].index(layer)]
            holders = sorted(slot // placement["slots_per_rank"] for slot, e in enumerate(row) if e == expert)
            assert ranks == ",".join(map(str, holders)), (where.group(0), row)

            await press(pilot, drill.fix_keys, "B")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
            await press(pilot, drill.fix_keys, "y")
            fixed = time.monotonic()
            await wait_for(pilot, lambda: "last rebalance #" in text_of(app, "#experts-ranks"), timeout=120,
                           what="the rebalance on the Experts screen")  # fmt: skip
            drill.saw("Experts: last rebalance, balancedness before -> after")
            shown = text_of(app, "#experts-ranks")
            ratios = re.search(r"last rebalance #\d+.*balancedness ([\d.]+) -> ([\d.]+)", shown)
            assert ratios and float(ratios.group(2)) > float(ratios.group(1)), shown
            assert re.search(r"expert +\d+: ranks? [\d,]+ -> ranks? [\d,]+", shown), shown
            # The same traffic on the new placement: the fleet row is balanced again.
            await press(pilot, [], "1")
            await wait_for(pilot, lambda: float(row_cells(app)[MOE]["bal"] or 0) >= 0.8
                           and "red" not in cell_style(app, MOE, "bal"), timeout=60,
                           what="BALANCE back above the threshold under the same traffic")  # fmt: skip
            drill.fix_effect_s = round(time.monotonic() - fixed, 2)
            drill.notes["balancedness"] = f"{before:.2f} -> {row_cells(app)[MOE]['bal']} (fleet row, same traffic)"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_drill_server_lost_in_a_real_terminal(fleet, drill_log):
    from tests.console.terminal import Terminal

    client = fleet.client
    server = wait_ready(client, MAIN, 180)
    term = Terminal(f"{sys.executable} -m tokenspeed console --state-dir {fleet.state_dir} --interval 0.5",
                    width=170, height=45)  # fmt: skip
    try:
        term.wait_for(MAIN, MOE, "3 ready", timeout=60)
        drill = drill_log.start("server lost", "kill -9 of the server's main process (in tmux)")
        os.kill(server["pid"], signal.SIGKILL)
        lost = time.monotonic()
        term.wait_for("2 ready", timeout=15)
        drill.saw("header: 2 ready")
        row = term.wait_for("2 ready", timeout=1)
        assert re.search(rf"{MAIN}\s+(STARTING|BACKOFF)", row), row
        # The row is on top (problems first); Home selects it and the detail line gives the signal.
        drill.diagnosis_keys.append("Home")
        term.send("Home")
        term.wait_for(f"{MAIN}  pid", "signal SIGKILL", timeout=15)
        drill.saw("detail: last exit signal SIGKILL", diagnosis=True)
        term.wait_for("3 ready", timeout=180)
        drill.fix_keys = ["(none: the supervisor restarts it)"]
        drill.fix_effect_s = round(time.monotonic() - lost, 2)
        assert client.server(MAIN)["pid"] != server["pid"]
    finally:
        term.close()
