"""The console over a supervised real `tokenspeed serve` (a tiny random MoE model on CPU), end to end.

The server runs its experts in parallel over two ranks (gloo) with two redundant slots, without
--enable-eplb. The operator turns expert recording on from the console, traffic arrives, and the Experts
screen draws the load the server's router really produced; `B` rebalances the experts through the
supervisor and the notification gives the balancedness before and after.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from console.client import SupervisorClient, SupervisorError
from console.tui.app import ConsoleApp
from console.tui.launch import start_supervisor
from console.tui.live_source import LiveSource
from tests.console.tui_pilot import log_lines, table_rows, text_of, wait_for
from tests.console.tui_support import free_base_port, shutdown

SIZE = (170, 50)


@pytest.fixture(scope="module")
def real_fleet():
    from tests.tiny_models import make_tiny_model

    root = Path(tempfile.mkdtemp(prefix="tsr-"))
    model = make_tiny_model("qwen3_moe", root / "models")
    port = free_base_port(1)
    profile = root / "real.toml"
    profile.write_text(
        f"""[server]
model = "{model}"
device = "cpu"
expert_distribution_recorder_mode = "stat"
attn_tp_size = 2
ep_size = 2
ep_num_redundant_experts = 2

[env]
GLOO_SOCKET_IFNAME = "lo"
OMP_NUM_THREADS = "1"

[fleet]
name = "real"
replicas = 1
base_port = {port}
startup_timeout_s = 300
stop_timeout_s = 10

[fleet.health]
interval_s = 1.0
"""
    )
    state_dir = root / "state"
    start_supervisor(profile, state_dir)
    client = SupervisorClient(state_dir, timeout=5.0)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            server = client.fleet()["servers"][0]
            if server["state"] == "READY":
                break
            assert server["state"] not in ("FATAL", "BACKOFF"), "\n".join(client.logs("real-0", 60)["lines"])
            time.sleep(0.5)
        else:
            raise AssertionError("the real server did not become READY")
        yield client, f"http://127.0.0.1:{port}"
    finally:
        shutdown(client, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def send_traffic(url: str, requests: int = 4) -> None:
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        for i in range(requests):
            answer = http.post(
                "/v1/completions",
                json={"model": model, "prompt": f"tell me about {i} experts", "max_tokens": 12},
            )
            assert answer.status_code == 200, answer.text


async def test_console_over_a_real_server_shows_its_metrics_args_and_expert_load(real_fleet):
    client, url = real_fleet
    app = ConsoleApp(LiveSource(client.state_dir, timeout=5.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: table_rows(app)["real-0"][3] == "READY", what="READY row", timeout=60)
        await pilot.press("x")  # start expert recording through the supervisor
        send_traffic(url)
        rows = await wait_for(
            pilot,
            lambda: table_rows(app)["real-0"][9] not in ("-", "0.0") and table_rows(app),
            what="tokens/s",
        )
        assert rows["real-0"][2] == "cpu"

        await pilot.press("3")
        heat = await wait_for(
            pilot,
            lambda: "balance" in text_of(app, "#experts-heatmap") and text_of(app, "#experts-heatmap"),
            what="a heatmap from the real router",
            timeout=60,
        )
        layers = [line for line in heat.splitlines()[1:] if line.strip() and line.split()[0].isdigit()]
        assert layers, heat
        assert "rank   0" in text_of(app, "#experts-ranks")

        await pilot.press("2")
        await wait_for(pilot, lambda: "moe" in text_of(app, "#server-mapping"), what="the Mapping table")
        assert "status: ready" in text_of(app, "#server-live")
        args = app.screen.query_one("#server-args")
        await wait_for(pilot, lambda: args.row_count > 50, what="resolved ServerArgs")
        values = {args.get_row_at(i)[0]: args.get_row_at(i)[1] for i in range(args.row_count)}
        assert values["expert_distribution_recorder_mode"] == "stat"
        assert values["device"] == "cpu"

        await pilot.press("4")
        await wait_for(pilot, lambda: len(log_lines(app)) > 3, what="the server's log")


async def test_restart_from_the_console_replaces_the_real_server(real_fleet):
    """`R` then `y` on a real server: the supervisor stops it (drain, exit), starts a new process, and
    the console shows it READY again; the new process answers requests."""
    import psutil

    from console.tui.screens.modals import ConfirmScreen

    client, url = real_fleet
    before = client.fleet()["servers"][0]["pid"]
    app = ConsoleApp(LiveSource(client.state_dir, timeout=5.0), interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: table_rows(app)["real-0"][3] == "READY", what="READY row", timeout=60)
        await pilot.press("R")
        assert isinstance(app.screen, ConfirmScreen)
        assert "Restart real-0?" in app.screen.question
        await pilot.press("y")

        def replaced_and_ready():
            server = client.fleet()["servers"][0]
            return server["pid"] not in (before, None) and server["state"] == "READY"

        await wait_for(pilot, replaced_and_ready, what="a new READY process", timeout=300)
        await wait_for(pilot, lambda: table_rows(app)["real-0"][3] == "READY", what="READY on screen")
    assert not psutil.pid_exists(before) or psutil.Process(before).status() == psutil.STATUS_ZOMBIE
    send_traffic(url, requests=1)


def record_notifications(app: ConsoleApp) -> list[tuple[str, str, str]]:
    """(message, title, severity) of every notification the app shows from now on."""
    seen: list[tuple[str, str, str]] = []
    notify = app.notify

    def recording_notify(message, *args, **kwargs):
        seen.append((str(message), str(kwargs.get("title", "")), str(kwargs.get("severity", "information"))))
        return notify(message, *args, **kwargs)

    app.notify = recording_notify  # type: ignore[method-assign]
    return seen


def said(seen: list[tuple[str, str, str]], text: str) -> bool:
    return any(text in message or text in title for message, title, _ in seen)


def rebalances_in_metrics(url: str) -> float:
    """The server's own counter (not the supervisor's last scrape)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tokenspeed:eplb_rebalances_total":
                return sample.value
    return 0.0


async def test_rebalance_experts_from_the_experts_screen(real_fleet):
    """`B` on the Experts screen asks, then rebalances through the supervisor: refused with the fix while
    nothing is recorded, then balancedness before -> after once recorded traffic arrived."""
    from console.tui.screens.modals import ConfirmScreen

    client, url = real_fleet
    app = ConsoleApp(LiveSource(client.state_dir, timeout=5.0), interval=0.5)
    seen = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: table_rows(app)["real-0"][3] == "READY", what="READY row", timeout=60)
        await pilot.press("3")
        await wait_for(pilot, lambda: "Rebalance" in text_of(app, "#keys"), what="B in the footer")
        await pilot.press("X")  # no recording session from here on
        await wait_for(pilot, lambda: said(seen, "expert record stop done"), what="stop done")
        try:  # use up a load an earlier test may have left recorded
            start = client.rebalance_experts("real-0")["rebalances"]
        except SupervisorError:
            start = rebalances_in_metrics(url)

        await pilot.press("B")
        assert isinstance(app.screen, ConfirmScreen)
        assert "Rebalance the experts of real-0?" in app.screen.question
        await pilot.press("y")
        _, _, severity = await wait_for(
            pilot,
            lambda: next((n for n in seen if n[1] == "rebalance experts failed"), None),
            what="the refusal",
            timeout=60,
        )
        refusal = next(m for m, t, _ in seen if t == "rebalance experts failed")
        assert severity == "error"
        assert "no expert load recorded" in refusal and "/start_expert_distribution_record" in refusal

        await pilot.press("x")  # start recording, then real traffic
        await wait_for(pilot, lambda: said(seen, "expert record start done"), what="start done")
        send_traffic(url, requests=4)
        await pilot.press("B", "y")
        done = await wait_for(
            pilot,
            lambda: next((m for m, t, _ in seen if t == "rebalance experts done"), None),
            what="the rebalance result",
            timeout=150,
        )
        assert done.startswith("real-0: balancedness ") and "expert slots moved" in done, done
        ratios = done.split("balancedness ")[1].split(",")[0].split(" -> ")
        before, after = (float(r) for r in ratios)
        assert 0 < before <= after <= 1, done
        assert f"(rebalance #{start + 1:.0f})" in done, done
        deadline = time.monotonic() + 30
        while rebalances_in_metrics(url) < start + 1 and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert rebalances_in_metrics(url) == start + 1
        await wait_for(
            pilot,
            lambda: f"rebalances: {start + 1:.0f}" in text_of(app, "#experts-ranks"),
            what="the rebalance on the Experts screen",
        )
        await pilot.press("X")


async def test_readonly_console_cannot_rebalance(real_fleet):
    client, url = real_fleet
    app = ConsoleApp(LiveSource(client.state_dir, timeout=5.0), interval=0.5, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: table_rows(app)["real-0"][3] == "READY", what="READY row", timeout=60)
        # a recorded load: a rebalance would go through if the console let one out
        assert httpx.post(f"{url}/start_expert_distribution_record", timeout=30, trust_env=False).is_success
        send_traffic(url, requests=1)
        before = rebalances_in_metrics(url)
        await pilot.press("3")
        await wait_for(pilot, lambda: "Back" in text_of(app, "#keys"), what="the Experts footer")
        assert "Rebalance" not in text_of(app, "#keys")
        await pilot.press("B", "y")
        assert app.screen.MODE == "experts"  # no confirmation dialog
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not any("Rebalance" in t for t in titles)
        await pilot.pause(1.0)
    assert rebalances_in_metrics(url) == before
    httpx.post(f"{url}/stop_expert_distribution_record", timeout=30, trust_env=False)
