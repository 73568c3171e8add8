"""The console where a fleet mistake used to cost a crash loop or a dead key: the Experts screen of a dense
server names the MoE servers and `m` shows one (x is refused with the same words); the profile screen lists
every problem of the profile at once (two typos, both shown); `tokenspeed console PROFILE` with them starts
nothing. Real supervisors over `supervised_http.py` servers (their models named `demo` and `demo-moe`)."""

from __future__ import annotations

from textual.widgets import TextArea

from console.tui.app import ConsoleApp
from console.tui.live_source import LiveSource
from tests.console.conftest import tokenspeed
from tests.console.tui_pilot import row_cells, text_of, wait_for

SIZE = (170, 40)
GROUPS = """
[groups.dense]
model = "demo"
replicas = 1

[groups.moe]
model = "demo-moe"
replicas = 1
"""


def _notes(app: ConsoleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_experts_screen_of_a_dense_server_names_the_moe_servers_and_m_shows_one(make_fleet):
    fleet = make_fleet(replicas=2, name="mx")  # two servers: two free ports
    fleet.profile.write_text(fleet.profile.read_text() + GROUPS)
    assert fleet.up().returncode == 0
    dense, moe = "mx-dense-0", "mx-moe-0"
    assert {s["name"]: s["moe"] for s in fleet.servers().values()} == {dense: False, moe: True}
    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(row_cells(app)) == 2, what="two rows")
        app.selected = dense
        await pilot.press("3")
        assert app.current_mode == "experts"
        shown = await wait_for(pilot, lambda: "dense model" in (t := text_of(app, "#experts-heatmap")) and t,
                               what="the dense server explained")  # fmt: skip
        assert f"{dense} serves a dense model: it has no experts." in shown
        assert f"MoE servers: {moe}; press m to show {moe}" in shown and "press x" not in shown
        # x (record experts) on the dense server: refused in the same words, nothing sent.
        await pilot.press("x")
        await wait_for(pilot, lambda: any("serves a dense model: no experts" in n for n in _notes(app)),
                       what="x refused")  # fmt: skip
        assert any(f"MoE servers: {moe}; on the Experts screen (3) press m" in n for n in _notes(app))
        await pilot.press("m")
        assert app.selected == moe
        await wait_for(pilot, lambda: moe in text_of(app, "#experts-title"), what="the MoE server's title")
        shown = await wait_for(pilot, lambda: "recording is off" in (t := text_of(app, "#experts-heatmap")) and t,
                               what="the MoE server's hint")  # fmt: skip
        assert f"expert recording is off on {moe}; press x to start it" in shown


async def test_a_fleet_without_moe_says_so_and_m_says_there_is_none(make_fleet):
    fleet = make_fleet(replicas=1, name="dn", model="demo")
    assert fleet.up().returncode == 0
    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(row_cells(app)) == 1, what="the row")
        await pilot.press("3")
        shown = await wait_for(pilot, lambda: "dense model" in (t := text_of(app, "#experts-heatmap")) and t,
                               what="the dense server explained")  # fmt: skip
        assert "no server of this fleet serves a MoE model" in shown
        await pilot.press("m")
        await wait_for(pilot, lambda: "no server of this fleet serves a MoE model" in _notes(app), what="m")
        assert app.selected == "dn-0"


async def test_profile_screen_lists_every_problem_at_once(make_fleet):
    fleet = make_fleet(replicas=1, name="pv")
    assert fleet.up().returncode == 0
    original = fleet.profile.read_text()
    app = ConsoleApp(LiveSource(fleet.state_dir, timeout=2.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        editor = app.screen.query_one(TextArea)
        await wait_for(pilot, lambda: editor.text == original, what="the fleet's profile in the editor")
        # The running fleet's own ports and state directory are no problem.
        await wait_for(pilot, lambda: "valid, 1 server(s): pv-0" in text_of(app, "#profile-errors"),
                       what="valid")  # fmt: skip
        lines = original.splitlines()
        typo_1, typo_2 = lines.index("max_restarts = 3"), lines.index("stop_timeout_s = 2")
        editor.load_text(
            original.replace("max_restarts = 3", "max_restart = 3").replace(
                "stop_timeout_s = 2", "stop_timeout = 2"
            )
        )
        errors = await wait_for(pilot, lambda: "2 problems" in (t := text_of(app, "#profile-errors")) and t,
                                what="both problems")  # fmt: skip
        assert (
            f"line {typo_1 + 1}: [fleet] max_restart: is not a [fleet] key (did you mean 'max_restarts'?)"
            in errors
        )
        assert f"line {typo_2 + 1}: [fleet] stop_timeout: is not a [fleet] key" in errors
        await pilot.press("ctrl+s")
        assert fleet.profile.read_text() == original  # refused


def test_console_with_a_profile_of_two_mistakes_lists_both_and_starts_nothing(tmp_path):
    profile = tmp_path / "two.toml"
    profile.write_text('[server]\nmodel = "demoo"\ndevice = "cpu"\nmax_num_seq = 2\n')
    state = tmp_path / "state"
    result = tokenspeed("console", str(profile), "--state-dir", str(state))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{profile}:2: [server] model: 'demoo' is neither a demo model" in result.stderr
    assert f"{profile}:4: [server] max_num_seq: is not a ServerArgs field" in result.stderr
    assert "2 problem(s); nothing was started" in result.stderr
    assert not (state / "control.sock").exists()
