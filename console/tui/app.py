"""`tokenspeed console`: the Textual operator console over a fleet's supervisor (or its recorded history).

The app owns the data source, the poll loop, the selection (cursor server and marked servers) and the
actions; the six screens (one app mode each) only draw what a poll brought back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from console.tui.action_results import describe
from console.tui.header_line import header_line
from console.tui.model import Snapshot
from console.tui.moe_servers import dense_refusal
from console.tui.poller import INTERVALS, Poller
from console.tui.screens.base import ConsoleScreen
from console.tui.screens.experts import ExpertsScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.gpus import GpusScreen
from console.tui.screens.logs import LogsScreen
from console.tui.screens.modals import ConfirmScreen, HelpScreen, LeaveScreen
from console.tui.screens.profile import ProfileScreen
from console.tui.screens.server import ServerScreen
from console.tui.source import DataSource, SourceError
from console.tui.widgets.scrollbar import use_whole_cell_scrollbars

SCREEN_ORDER = ("fleet", "server", "experts", "logs", "profile", "gpus")

# action name -> (verb shown to the operator, needs a confirmation)
SERVER_ACTIONS = {
    "restart": ("Restart", True),
    "stop": ("Stop", True),
    "start": ("Start", False),
    "flush_cache": ("Flush the prefix cache of", False),
    "expert_record_start": ("Start expert recording on", False),
    "expert_record_stop": ("Stop expert recording on", False),
    # moves expert weights between the ranks of a live server (the Experts screen's `B`)
    "rebalance_experts": ("Rebalance the experts of", True),
}
ACTION_NAMES = {"server_action", "rolling_restart"}


class ConsoleApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "TokenSpeed console"
    MODES = {
        "fleet": FleetScreen,
        "server": ServerScreen,
        "experts": ExpertsScreen,
        "logs": LogsScreen,
        "profile": ProfileScreen,
        "gpus": GpusScreen,
    }
    BINDINGS = [
        Binding("q", "leave", "Quit"),
        Binding("question_mark", "help", "Help"),
        *[
            Binding(str(i + 1), f"switch_screen_to('{mode}')", mode.capitalize(), show=False)
            for i, mode in enumerate(SCREEN_ORDER)
        ],
        Binding("p", "toggle_pause", "Pause"),
        Binding("r", "cycle_interval", "Interval"),
        Binding("R", "server_action('restart')", "Restart"),
        Binding("S", "server_action('stop')", "Stop"),
        Binding("s", "server_action('start')", "Start", show=False),
        Binding("F", "server_action('flush_cache')", "Flush", show=False),
        Binding("x", "server_action('expert_record_start')", "Rec experts", show=False),
        Binding("X", "server_action('expert_record_stop')", "Stop rec", show=False),
        Binding("ctrl+r", "rolling_restart", "Rolling restart", show=False),
        Binding("left_square_bracket", "seek(-10)", "-10s", show=False),
        Binding("right_square_bracket", "seek(10)", "+10s", show=False),
        Binding("left_curly_bracket", "seek(-60)", "-60s", show=False),
        Binding("right_curly_bracket", "seek(60)", "+60s", show=False),
    ]

    def __init__(
        self,
        source: DataSource,
        *,
        readonly: bool = False,
        interval: float = 1.0,
        started_fleet: bool = False,
        profile_path: str | None = None,
        state_dir: str | None = None,
    ) -> None:
        super().__init__()
        use_whole_cell_scrollbars()  # no eighth-block glyphs beside log and ServerArgs lines
        self.state_dir = state_dir
        self.source = source
        self.readonly = readonly or source.readonly
        self.started_fleet = started_fleet
        self.profile_path = profile_path
        self.snapshot: Snapshot | None = None
        self.selected: str | None = None
        self.marked: set[str] = set()
        self.stop_fleet_on_exit = False
        self.poller = Poller(self, source, self._poll_request, self._deliver, interval)
        self.sub_title = source.label + ("  [read-only]" if self.readonly else "")

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        self.switch_mode("fleet")
        self.poller.start()

    # ------------------------------------------------------------------ polling

    def _console_screen(self) -> ConsoleScreen | None:
        for screen in reversed(self.screen_stack):
            if isinstance(screen, ConsoleScreen):
                return screen
        return None

    def _poll_request(self):
        screen = self._console_screen()
        return screen, (screen.poll_request() if screen is not None else None)

    def _deliver(self, snapshot: Snapshot, owner: object) -> None:
        previous = self.snapshot
        if snapshot.fleet is None and previous is not None and previous.fleet is not None:
            # Keep showing the last fleet we saw, marked stale by the error line.
            snapshot = replace(snapshot, fleet=previous.fleet)
        self.snapshot = snapshot
        if self.selected is None and snapshot.fleet is not None and snapshot.fleet.servers:
            self.selected = snapshot.fleet.servers[0].name
        screen = self._console_screen()
        if screen is None:
            return
        if screen is not owner:
            # The operator switched screens mid-poll: the extra data belongs to another screen.
            snapshot = replace(snapshot, extra=None, extra_error=None)
        screen.show(snapshot)
        self.refresh_status()

    def poll_now(self) -> None:
        self.poller.poll_now()

    def status_line(self) -> str:
        state = self.poller.state
        return header_line(
            self.snapshot, replay_at=self.source.now, paused=state.paused, interval=state.interval,
            readonly=self.readonly, marked=len(self.marked),
        )  # fmt: skip

    def refresh_status(self) -> None:
        screen = self._console_screen()
        if screen is not None and screen.is_mounted:
            screen.show_status(self.status_line())

    # ------------------------------------------------------------------ navigation

    def action_switch_screen_to(self, mode: str) -> None:
        if mode != self.current_mode:
            self.switch_mode(mode)

    def action_next_screen(self, step: int) -> None:
        index = SCREEN_ORDER.index(self.current_mode) if self.current_mode in SCREEN_ORDER else 0
        self.switch_mode(SCREEN_ORDER[(index + step) % len(SCREEN_ORDER)])

    def open_server(self, name: str, mode: str = "server") -> None:
        self.selected = name
        self.switch_mode(mode)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self._help_rows()))

    def _help_rows(self) -> list[tuple[str, str]]:
        from console.tui.help_keys import help_rows

        return help_rows(self, self._console_screen(), self.focused)

    def offers(self, action: str) -> bool:
        """Whether the key for `action` does something here: not actions in a read-only console, not
        replay keys in a live one. (Such keys still answer, with a notice, when pressed.)"""
        if self.readonly and action in ("server_action", "rolling_restart"):
            return False
        return self.check_action(action, ()) is not False

    def action_toggle_pause(self) -> None:
        self.poller.set_paused(not self.poller.state.paused)
        self.refresh_status()

    def action_cycle_interval(self) -> None:
        current = self.poller.state.interval
        later = [i for i in INTERVALS if i > current + 1e-9]
        self.poller.set_interval(later[0] if later else INTERVALS[0])
        self.notify(f"refresh every {self.poller.state.interval:g}s", timeout=2)
        self.refresh_status()

    def action_seek(self, delta: float) -> None:
        if self.source.now is None:
            return
        self.source.seek(delta)
        self.poll_now()

    # ------------------------------------------------------------------ actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "seek" and self.source.now is None:
            return False
        return True

    def refused_readonly(self, what: str) -> bool:
        """True (and a notice that says why) when --readonly (or a replay) turns `what` off."""
        if not self.readonly:
            return False
        why = "a replay shows a recording" if self.source.readonly else "the console runs with --readonly"
        self.notify(f"{what} is off: {why}", severity="warning", timeout=4)
        return True

    def targets(self) -> list[str]:
        """Marked servers, or else the cursor server."""
        if self.marked:
            return sorted(self.marked)
        return [self.selected] if self.selected else []

    def action_server_action(self, name: str) -> None:
        verb, confirm = SERVER_ACTIONS[name]
        if self.refused_readonly(verb.split()[0]):
            return
        targets = self.targets()
        if not targets:
            self.notify("no server selected", severity="warning")
            return
        refusal = dense_refusal(self.snapshot.fleet if self.snapshot else None, name, targets)
        if refusal:
            self.notify(refusal, severity="warning", timeout=6, markup=False)
            return
        question = f"{verb} {', '.join(targets)}?"
        if name in ("restart", "stop"):
            question += self._drain_note(targets)
        if confirm:
            self.push_screen(
                ConfirmScreen(question, confirm_label=verb.split()[0]),
                lambda ok: ok and self._run_actions(name, targets),
            )
        else:
            self._run_actions(name, targets)

    def _drain_note(self, targets: list[str]) -> str:
        """What a stop does to the requests in flight, in numbers, for the confirmation."""
        fleet = self.snapshot.fleet if self.snapshot else None
        if fleet is None:
            return ""
        counts = [s.in_flight for name in targets if (s := fleet.server(name)) is not None]
        known = [c for c in counts if c is not None]
        timeout = f"{fleet.stop_timeout_s:g} s" if fleet.stop_timeout_s else "stop_timeout_s"
        if not known:
            return f"\nRequests in flight (unknown) get up to {timeout} to finish; new ones get 503 + Retry-After."
        total = sum(known)
        return (
            f"\n{total} request(s) in flight: they get up to {timeout} to finish (drain); new ones get 503 "
            "with Retry-After; what is still running then is cut off."
        )

    def action_rolling_restart(self) -> None:
        if self.refused_readonly("Rolling restart"):
            return
        self.push_screen(
            ConfirmScreen("Restart every server, one at a time, each back READY first?", "Rolling restart"),
            lambda ok: ok and self._run_actions("rolling_restart", [None]),
        )

    def _run_actions(self, name: str, targets: list[str | None]) -> None:
        def work() -> None:
            failures, notes = [], []
            for target in targets:
                try:
                    note = describe(name, target, self.source.action(name, target))
                except SourceError as exc:
                    failures.append(str(exc))  # it starts with the server (or "fleet") it concerns
                else:
                    if note:
                        notes.append(note)
            self.call_from_thread(self._actions_done, name, targets, failures, notes)

        self.notify(f"{name.replace('_', ' ')}: {', '.join(t or 'fleet' for t in targets)}", timeout=3)
        self.run_worker(work, thread=True, group="action", exit_on_error=False)

    def _actions_done(
        self, name: str, targets: list[str | None], failures: list[str], notes: list[str] | None = None
    ) -> None:
        title = name.replace("_", " ")
        if notes:
            self.notify("\n".join(notes), title=f"{title} done", timeout=10, markup=False)
        if failures:
            self.notify(
                "\n".join(failures), title=f"{title} failed", severity="error", timeout=12, markup=False
            )
        elif not notes:
            self.notify(f"{title} done", timeout=3)
        if not failures:
            self.marked.clear()
        self.poll_now()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for i, mode in enumerate(SCREEN_ORDER):
            yield SystemCommand(f"Screen: {mode}", f"key {i + 1}", lambda m=mode: self.switch_mode(m))
        yield SystemCommand("Pause / resume polling", "key p", self.action_toggle_pause)
        yield SystemCommand("Change refresh interval", "key r", self.action_cycle_interval)
        if not self.readonly:
            for name, (verb, _) in SERVER_ACTIONS.items():
                yield SystemCommand(
                    f"{verb} selected server(s)", name, lambda n=name: self.action_server_action(n)
                )
            yield SystemCommand("Rolling restart of the fleet", "ctrl+r", self.action_rolling_restart)

    def profile_fleet(self, path: str) -> tuple[str, str]:
        """(fleet name, state directory) of the fleet a profile describes."""
        from console.profile.fleet import load_profile
        from console.supervisor.paths import default_state_dir

        name = load_profile(path).fleet.name
        watching = self.snapshot.fleet.name if self.snapshot and self.snapshot.fleet else None
        # This console's own fleet keeps its state directory; another fleet gets its default one.
        own = self.state_dir or getattr(self.source, "state_dir", None)
        directory = str(own) if own and name == watching else str(default_state_dir(name))
        return name, directory

    def launch_profile_dry_run(self, path: str) -> dict | None:
        """What reloading `path` would change in its running fleet; None when that fleet is not running."""
        from console.client import SupervisorClient

        _, directory = self.profile_fleet(path)
        with SupervisorClient(directory, timeout=1.0) as client:
            return client.reload(dry_run=True) if client.alive() else None

    def launch_profile(self, path: str, dry_run: bool = True) -> str | dict:
        """Start the fleet of a profile; when its supervisor already runs, reload the profile there instead:
        the change it would make (`dry_run`, a dict as `tokenspeed reload --json`) or has made. Called from a
        worker thread; SupervisorError when the supervisor refuses the profile."""
        from console.client import SupervisorClient
        from console.tui.launch import start_supervisor

        name, directory = self.profile_fleet(path)
        with SupervisorClient(directory, timeout=1.0) as client:
            if client.alive():
                return client.reload(dry_run=dry_run)
        if not dry_run:
            raise RuntimeError(f"fleet {name} is not running any more; ctrl+l starts it")
        start_supervisor(path, directory)
        return f"fleet {name} started from {path} (supervisor in {directory})"

    # ------------------------------------------------------------------ leaving

    def action_leave(self) -> None:
        if self.started_fleet and not self.readonly:
            self.push_screen(LeaveScreen(), self._leave_answer)
        else:
            self.exit(0)

    def _leave_answer(self, answer: str | None) -> None:
        if answer == "stop":
            self.stop_fleet_on_exit = True
            self.exit(0)
        elif answer == "keep":
            self.exit(0)


def run(
    target: str | None = None,
    fleet: str | None = None,
    state_dir: str | None = None,
    readonly: bool = False,
    replay: str | None = None,
    at: str | None = None,
    interval: float = 1.0,
) -> int:
    """Entry point of `tokenspeed console`; returns the process exit code."""
    from console.tui.launch import open_source

    profile = None
    if target is not None:
        if fleet is not None:
            raise ValueError("give a PROFILE (or fleet name) or --fleet, not both")
        # A TARGET that is a file (or looks like one) is a profile; anything else names a fleet.
        is_profile = Path(target).is_file() or Path(target).suffix == ".toml"
        profile, fleet = (target, None) if is_profile else (None, target)
    if interval <= 0:
        raise ValueError("--interval must be > 0 seconds (for example --interval 1)")
    if replay is not None and (profile is not None or fleet is not None):
        raise ValueError("--replay shows a recording; it takes no PROFILE or --fleet")
    opened = open_source(profile=profile, fleet=fleet, state_dir=state_dir, replay=replay, at=at)
    app = ConsoleApp(
        opened.source,
        readonly=readonly,
        interval=interval,
        started_fleet=opened.started_fleet,
        profile_path=opened.profile_path,
        state_dir=str(opened.state_dir) if opened.state_dir else None,
    )
    try:
        app.run()
        if app.stop_fleet_on_exit:
            opened.stop_fleet()
    finally:
        opened.source.close()
    return 0 if app.return_code in (None, 0) else int(app.return_code)
