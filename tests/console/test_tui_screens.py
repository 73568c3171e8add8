"""Every console screen against a real fleet: a supervisor daemon and three real server processes."""

from __future__ import annotations

import gc
import io
import time

from rich.console import Console
from textual.widgets import DataTable, TextArea

from console.tui.app import ConsoleApp
from console.tui.live_source import LiveSource
from console.tui.model import History
from console.tui.screens.modals import HelpScreen
from console.tui.screens.server import PLOTS
from console.tui.widgets.panel import TextPanel
from console.tui.widgets.plot import MetricPlot
from tests.console.tui_pilot import (
    EIGHTH_BLOCKS,
    log_lines,
    row_order,
    screen_lines,
    status,
    table_rows,
    text_of,
    wait_for,
    wait_for_rows,
)
from tests.console.tui_support import fleet_fixture, make_app

SIZE = (170, 50)


fleet = fleet_fixture("scr")


async def open_screen(pilot, app: ConsoleApp, key: str) -> None:
    """Once the fleet's three servers are listed, the screen of number key `key` (on the cursor server)."""
    await wait_for_rows(pilot, app, 3)
    await pilot.press(key)


async def test_fleet_screen_shows_every_server_with_its_metrics(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        rows = await wait_for(pilot, lambda: len(table_rows(app)) == 3 and table_rows(app), what="3 rows")
        # KV usage shows from the first scrape; percentiles need two (they come from bucket deltas).
        rows = await wait_for(
            pilot,
            lambda: all("%" in r[7] and "ms/" in r[10] for r in table_rows(app).values()) and table_rows(app),
            what="KV usage and TTFT percentiles on every row",
        )
        assert sorted(rows) == ["scr-0", "scr-1", "scr-2"]
        for name, cells in rows.items():
            server = fleet.server(name)
            assert cells[1] == "127.0.0.1"  # node
            assert cells[2] == "cpu"  # no GPUs
            assert cells[3] == "READY"
            assert cells[6] == f"{server['metrics']['running']:.0f}/{cells[6].split('/')[1]}"
            assert cells[9] != "-"  # tokens/s
            assert "ms/" in cells[10]  # TTFT p50/p99 from histogram buckets
        line = status(app)
        assert "scr" in line and "3 servers" in line and "3 ready" in line
        assert "nodes: 127.0.0.1 3/3" in text_of(app, "#fleet-nodes")


async def test_sort_and_filter(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        screen = app.screen
        while screen.sort_key != "name":
            await pilot.press("o")
        assert row_order(app) == ["scr-0", "scr-1", "scr-2"]
        await pilot.press("O")
        assert row_order(app) == ["scr-2", "scr-1", "scr-0"]
        await pilot.press("slash")
        await pilot.press(*"scr-1")
        assert row_order(app) == ["scr-1"]
        assert "1 of 3 shown" in text_of(app, "#fleet-detail")
        await pilot.press("escape")
        assert len(row_order(app)) == 3
        await pilot.press("slash", *"!scr-[01]", "enter")
        assert row_order(app) == ["scr-2"]
        await pilot.press("escape")
        assert len(row_order(app)) == 3


async def test_enter_opens_the_server_screen_with_history_args_and_mapping(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        await pilot.press("down", "enter")
        assert app.current_mode == "server"
        name = app.selected
        assert name in text_of(app, "#server-title")

        def plots_filled():
            plots = [app.screen.query_one(f"#{p[0]}", MetricPlot) for p in PLOTS]
            return all(p._series and len(p._series) >= 2 for p in plots)

        await wait_for(pilot, plots_filled, what="history plots")
        tps = app.screen.query_one("#plot-tps", MetricPlot)
        history = fleet.client.history(name, 300)["samples"]
        assert max(tps._series) <= max(s["gen_throughput"] for s in history) + 1e-9
        args = app.screen.query_one("#server-args", DataTable)
        await wait_for(pilot, lambda: args.row_count > 0, what="server args")
        values = {args.get_row_at(i)[0]: args.get_row_at(i)[1] for i in range(args.row_count)}
        assert values["ep_size"] == "2"
        assert values["port"] == str(fleet.server(name)["port"])
        assert "world_size: 1" in text_of(app, "#server-mapping")
        await pilot.press("escape")
        assert app.current_mode == "fleet"


async def _polls_stopped(app, pilot) -> None:
    """Pause polling and let the poll in flight land: the screen stays as it is drawn."""
    app.poller.set_paused(True)
    await wait_for(pilot, lambda: not app.poller.state.in_flight, what="the last poll drawn")
    await pilot.pause(0.3)


async def test_server_screen_fetches_only_new_samples_and_plots_what_the_supervisor_recorded(fleet):
    """After the first poll the Server screen asks only for samples newer than its last one; the history it
    then holds (and plots) is the supervisor's recording, sample for sample."""
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "2")
        name = app.selected
        screen = app.screen
        await wait_for(
            pilot, lambda: screen._history is not None and screen._history[1].samples, what="history"
        )
        first = screen._history[1].samples[-1].t
        await wait_for(
            pilot,
            lambda: screen._history[1].samples[-1].t >= first + 3,
            what="newer samples added",
            timeout=60,
        )
        await _polls_stopped(app, pilot)
        held = screen._history[1].samples
        recorded = History.from_json(fleet.client.history(name, 300)).samples
        assert held[0].t >= time.time() - 300 - 5  # nothing older than the window is kept
        # The recording as far as the screen got, from its own first sample (the window has moved since).
        expected = [s for s in recorded if held[0].t <= s.t <= held[-1].t]
        assert [(s.t, s.metrics) for s in held] == [(s.t, s.metrics) for s in expected]
        for plot_id, _title, key, _render, _ratio in PLOTS:
            assert screen.query_one(f"#{plot_id}", MetricPlot)._series == tuple(History(held).series(key))


def styled_screen(app: ConsoleApp) -> str:
    """The screen as the terminal gets it: text, colours and styles."""
    console = Console(
        width=app.size.width, file=io.StringIO(), record=True, color_system="truecolor", force_terminal=True
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text(styles=True)


async def test_screens_redrawn_line_by_line_show_what_a_whole_redraw_shows(fleet):
    """Each poll redraws only the lines that changed (panels, plots); the terminal then shows exactly what
    drawing every line of the screen again shows."""
    collector = gc.get_threshold()
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        for key in ("2", "3"):
            app.poller.set_paused(False)
            await pilot.press(key)
            polls = app.poller.state.polls
            await wait_for(pilot, lambda p=polls: app.poller.state.polls >= p + 4, what="four polls drawn")
            await _polls_stopped(app, pilot)
            if key == "3":  # the rank loads move every poll: that panel is drawn line by line
                assert app.screen.query_one("#experts-ranks", TextPanel)._lines is not None
            shown = styled_screen(app)
            for panel in app.screen.query(TextPanel):
                panel._lines = None
                panel.refresh()
            for plot in app.screen.query(MetricPlot):
                plot._strips.clear()
                plot.refresh()
            await pilot.pause(0.3)
            assert styled_screen(app) == shown
        assert gc.get_freeze_count() > 0 and gc.get_threshold() != collector  # tuned while it runs
    # and handed back when it closes: a later console (or test) gets the collector as it was
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == collector


async def server_args(pilot, app: ConsoleApp) -> DataTable:
    """The cursor server's ServerArgs table on the Server screen, once the supervisor's answer filled it."""
    await open_screen(pilot, app, "2")
    args = app.screen.query_one("#server-args", DataTable)
    await wait_for(pilot, lambda: args.row_count > 0, what="server args")
    return args


async def test_server_args_lines_have_no_stray_glyph_at_their_right_edge(fleet):
    """The ServerArgs table's right edge holds its scrollbar: drawn in whole cells, never a `▁▁` that reads
    as part of the line beside it (30 lines: the table shows fewer rows than there are arguments)."""
    app = make_app(fleet)
    async with app.run_test(size=(100, 30)) as pilot:
        args = await server_args(pilot, app)
        await pilot.pause(0.3)
        assert args.max_scroll_y > 0  # a scrollbar beside the arguments
        lines = screen_lines(app)
        # The side panel, right of the history plots (which draw eighth blocks on purpose).
        side = next(line.index("ServerArgs") for line in lines if "ServerArgs" in line)
        assert not [line for line in lines if EIGHTH_BLOCKS & set(line[side:])], "\n".join(lines)


async def test_server_args_are_reachable_at_80x24(fleet):
    """On a small terminal the Server screen's side panel scrolls: the resolved ServerArgs are below the
    process list and live state, a few rows high, never squeezed to nothing."""
    app = make_app(fleet)
    async with app.run_test(size=(80, 24)) as pilot:
        await server_args(pilot, app)
        app.screen.query_one("#server-side").scroll_end(animate=False)
        await pilot.pause(0.3)
        lines = screen_lines(app)
        assert any("ServerArgs (resolved)" in line for line in lines), "\n".join(lines)
        assert sum(key in "\n".join(lines) for key in ("argv", "enable_metrics", "ep_size")) >= 2


async def test_experts_screen_draws_the_load_heatmap(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "3")
        assert app.current_mode == "experts"
        heat = await wait_for(
            pilot, lambda: "balance" in text_of(app, "#experts-heatmap") and text_of(app, "#experts-heatmap")
        )
        lines = heat.splitlines()
        assert lines[0].split()[:9] == ["layer", "0", "1", "2", "3", "4", "5", "6", "7"]
        assert [line.split()[0] for line in lines[1:5]] == ["0", "1", "2", "3"]
        assert lines[1].split()[-1] == "0.55"  # eplb_balancedness{layer="0"}
        ranks = text_of(app, "#experts-ranks")
        assert "rank   0" in ranks and "rank   1" in ranks  # ep_size 2 from the server's info
        assert "worst layer: 0 balancedness 0.55" in ranks
        assert "rebalances:" in ranks


async def test_logs_screen_follows_searches_and_filters_by_level(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "4")
        assert app.current_mode == "logs"
        await wait_for(
            pilot, lambda: any("listening on" in line for line in log_lines(app)), what="log lines"
        )
        assert any("DEBUG" in line for line in log_lines(app))
        await pilot.press("v", "v", "v")  # DEBUG -> INFO -> WARNING -> ERROR
        lines = log_lines(app)
        assert lines and all("ERROR" in line for line in lines)
        assert "level>=ERROR" in text_of(app, "#logs-title")
        await pilot.press("v")  # back to everything
        await pilot.press("slash", *"arguments", "enter")
        lines = log_lines(app)
        assert lines and all("arguments" in line for line in lines)
        await pilot.press("escape")
        assert any("listening on" in line for line in log_lines(app))
        await pilot.press("f")
        assert "follow off" in text_of(app, "#logs-title")
        await pilot.press("escape")
        assert app.current_mode == "fleet"


async def test_profile_screen_validates_inline_and_refuses_to_save_a_bad_profile(fleet):
    app = make_app(fleet)
    original = fleet.profile.read_text()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        assert app.current_mode == "profile"
        editor = app.screen.query_one(TextArea)
        await wait_for(pilot, lambda: editor.text == original, what="the fleet's profile in the editor")
        await wait_for(pilot, lambda: "valid, 3 server(s)" in text_of(app, "#profile-errors"))
        assert "scr-0, scr-1, scr-2" in text_of(app, "#profile-errors")
        line = original.splitlines().index("replicas = 3")
        await pilot.press("e")
        editor.move_cursor((line, len("replica")))
        await pilot.press("z", "delete")  # replicas -> replicaz
        errors = await wait_for(
            pilot, lambda: "replicaz" in text_of(app, "#profile-errors") and text_of(app, "#profile-errors")
        )
        assert f"line {line + 1}" in errors and "did you mean 'replicas'" in errors
        assert "[modified]" in text_of(app, "#profile-title")
        await pilot.press("ctrl+s")
        assert fleet.profile.read_text() == original  # refused
        await pilot.press("backspace", "s")  # and back
        await wait_for(pilot, lambda: "valid" in text_of(app, "#profile-errors"), what="valid again")
        await pilot.press("escape")  # leave the editor
        await pilot.press("ctrl+t")
        plan = await wait_for(
            pilot, lambda: "scr-0" in text_of(app, "#profile-plan") and text_of(app, "#profile-plan")
        )
        assert "cpu" in plan


async def test_profile_editor_types_on_the_line_the_arrows_reach_and_saves_only_valid_toml(fleet):
    """Arrow keys count lines as the gutter numbers them, also past a line wider than the editor (the long
    `command = [...]`, at 80 columns); save checks the very text it saves, however fast it follows typing."""
    app = make_app(fleet)
    original = fleet.profile.read_text()
    lines = original.splitlines()
    target = lines.index("stop_timeout_s = 5.0")
    assert any(len(line) > 60 for line in lines[:target])  # a line that wraps at 80 columns comes first
    try:
        async with app.run_test(size=(80, 30)) as pilot:
            await pilot.press("5")
            editor = app.screen.query_one(TextArea)
            await wait_for(pilot, lambda: editor.text == original, what="the fleet's profile in the editor")
            await pilot.press("e")
            await wait_for(pilot, lambda: editor.has_focus, what="the editor focused")
            await pilot.press(*["down"] * target, "end", "1", "2")
            assert f"line {target + 1}, col 23" in text_of(app, "#profile-title")
            await pilot.press("ctrl+s")
            saved = fleet.profile.read_text().splitlines()
            assert saved[target] == "stop_timeout_s = 5.012"
            assert saved[:target] + saved[target + 1 :] == lines[:target] + lines[target + 1 :]
            # Invalid TOML, saved at once (before the check as-you-type runs): refused, the file untouched.
            await pilot.press("home", "quotation_mark", "ctrl+s")
            assert fleet.profile.read_text().splitlines() == saved
            assert "not valid TOML" in text_of(app, "#profile-errors")
    finally:
        fleet.profile.write_text(original)


async def test_gpus_screen_shows_the_probe(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        assert app.current_mode == "gpus"
        probe = fleet.client.probe()
        table = await wait_for(pilot, lambda: text_of(app, "#gpus-table"), what="probe view")
        if probe.get("gpus"):
            assert probe["gpus"][0]["name"] in table
        else:
            assert "no GPU found" in table
        plan = await wait_for(
            pilot, lambda: "scr-2" in text_of(app, "#gpus-plan") and text_of(app, "#gpus-plan")
        )
        assert "fits" in plan


async def test_keys_switch_screens_help_and_pause(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        for key, mode in zip(
            "123456", ("fleet", "server", "experts", "logs", "profile", "gpus"), strict=True
        ):
            await pilot.press(key)
            assert app.current_mode == mode
        await pilot.press("tab")
        assert app.current_mode == "fleet"
        await pilot.press("shift+tab")
        assert app.current_mode == "gpus"
        await pilot.press("1", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("p")
        assert "PAUSED" in status(app)
        await pilot.pause(0.3)
        polls = app.poller.state.polls
        await pilot.pause(1.5)
        assert app.poller.state.polls == polls  # nothing polled while paused
        await pilot.press("p")
        await wait_for(pilot, lambda: app.poller.state.polls > polls + 1, what="polling resumed")
        await pilot.press("r")
        assert app.poller.state.interval == 1.0 and "every 1s" in status(app)


async def test_command_palette_offers_screens_and_actions(fleet):
    app = make_app(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Screen: logs" in titles and "Restart selected server(s)" in titles
        await pilot.press("ctrl+p")
        await pilot.press(*"Screen: gpus")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.current_mode == "gpus", what="palette switched screen")


async def test_a_stopped_supervisor_never_blocks_the_ui(fleet):
    import os
    import signal

    sup_pid = fleet.client.fleet()["supervisor_pid"]
    # A long client timeout: each poll of the frozen supervisor hangs for seconds.
    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=4.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_rows(pilot, app, 3)
        os.kill(sup_pid, signal.SIGSTOP)
        try:
            await wait_for(pilot, lambda: app.poller.state.in_flight, what="a poll hanging on the socket")
            await pilot.press("2", "4", "1")
            # The screens switched while that poll was still waiting for an answer.
            assert app.current_mode == "fleet" and app.poller.state.in_flight
            await wait_for(pilot, lambda: "supervisor unreachable" in status(app), what="unreachable banner")
            assert len(table_rows(app)) == 3  # the last known fleet stays on screen
        finally:
            os.kill(sup_pid, signal.SIGCONT)
        await wait_for(pilot, lambda: "unreachable" not in status(app), what="recovery")
