"""Profile screen: edit the fleet's TOML with validation as you type, see the probe's plan, save, launch."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static, TextArea

from console.tui.model import Snapshot
from console.tui.profile_check import CheckResult, check_profile_text, plan_profile_text
from console.tui.screens.base import ConsoleScreen
from console.tui.screens.gpus import plan_text
from console.tui.screens.modals import ConfirmScreen

CHECK_DELAY_S = 0.4


class ProfileScreen(ConsoleScreen):
    MODE = "profile"
    # Nothing focused on arrival, so number keys still switch screens; `e` (or enter) starts editing.
    AUTO_FOCUS = ""
    BINDINGS = [
        *ConsoleScreen.BINDINGS,
        Binding("escape", "leave_editor", "Back"),
        Binding("e,enter", "edit", "Edit"),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+t", "plan", "Plan"),
        Binding("ctrl+l", "launch", "Apply / launch"),
        Binding("ctrl+g", "goto_error", "Go to error", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.path: str | None = None
        self.result: CheckResult | None = None
        self._check_timer = None
        self._saved_text: str | None = None
        # The last check knew the watched fleet (whose own ports and directory are no problem); one made
        # before the first answer is made again once it comes.
        self._checked_knowing_fleet = False

    def compose(self):
        yield from self.compose_header()
        yield Static("", id="profile-title", classes="title")
        with Horizontal(id="profile-body"):
            with Vertical(id="profile-left"):
                # No soft wrap: a wrapped line (a long `command = [...]`) takes several arrow presses, so
                # counting lines by the gutter's numbers put typed text on the line above the one meant.
                yield TextArea(
                    "", id="profile-editor", show_line_numbers=True, tab_behavior="indent", soft_wrap=False
                )
                yield Static("", id="profile-errors")
            with VerticalScroll(id="profile-right"):
                yield Static("Plan (ctrl+t)", classes="section")
                yield Static(Text("press ctrl+t to ask the probe", style="dim"), id="profile-plan")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self.path = self.console.profile_path
        if self.path:
            self.load(self.path)

    def load(self, path: str) -> None:
        self.path = path
        try:
            text = Path(path).read_text()
        except OSError as exc:
            self.query_one("#profile-errors", Static).update(Text(f"{path}: {exc}", style="bold red"))
            return
        self._saved_text = text
        self.query_one(TextArea).load_text(text)
        self._draw_title()
        self._check_now()

    def show(self, snapshot: Snapshot) -> None:
        # Attached with --fleet: the supervisor knows which profile the fleet came from.
        if self.path is None and snapshot.fleet is not None and snapshot.fleet.profile_path:
            self.load(snapshot.fleet.profile_path)
        elif snapshot.fleet is not None and not self._checked_knowing_fleet:
            self._check_now()

    def _draw_title(self) -> None:
        text = self.query_one(TextArea).text
        dirty = self._saved_text is not None and text != self._saved_text
        title = Text(self.path or "no profile (start the console with a PROFILE)", style="bold")
        if dirty:
            title.append("  [modified]", style="yellow")
        if self.console.readonly:
            title.append("  read-only", style="cyan")
        editor = self.query_one(TextArea)
        if editor.has_focus:
            row, column = editor.cursor_location
            title.append(f"  line {row + 1}, col {column + 1}", style="dim")
        self.query_one("#profile-title", Static).update(title)

    def on_text_area_selection_changed(self, event: TextArea.SelectionChanged) -> None:
        self._draw_title()  # where typing goes, also where the cursor line does not stand out

    def on_descendant_focus(self) -> None:
        self._draw_title()

    def on_descendant_blur(self) -> None:
        self._draw_title()

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self._draw_title()
        if self._check_timer is not None:
            self._check_timer.stop()
        self._check_timer = self.set_timer(CHECK_DELAY_S, self._check_now)

    def _check_now(self) -> None:
        if self.path is None:
            return
        text, path = self.query_one(TextArea).text, self.path
        state_dir = self._state_dir()
        snapshot = self.console.snapshot
        self._checked_knowing_fleet = snapshot is not None and snapshot.fleet is not None

        def work() -> None:
            result = check_profile_text(text, path, state_dir)
            self.app.call_from_thread(self._show_result, text, result)

        self.run_worker(work, thread=True, group="profile-check", exclusive=True, exit_on_error=False)

    def _state_dir(self) -> str | None:
        """Where the profile's fleet is kept: the console's own directory when the fleet it watches runs
        from this very file (its ports are its own); else None, the profile's default one."""
        snapshot = self.console.snapshot
        watched = snapshot.fleet.profile_path if snapshot is not None and snapshot.fleet is not None else None
        own = self.console.state_dir or getattr(self.console.source, "state_dir", None)
        if (
            not own
            or not watched
            or self.path is None
            or Path(watched).resolve() != Path(self.path).resolve()
        ):
            return None
        return str(own)

    def _show_result(self, text: str, result: CheckResult) -> None:
        if text != self.query_one(TextArea).text:
            return  # the operator typed on; a newer check is coming
        self.result = result
        style = "green" if result.ok else "bold red"
        self.query_one("#profile-errors", Static).update(Text(result.describe(self.path or ""), style=style))

    def action_goto_error(self) -> None:
        if self.result is not None and self.result.line:
            editor = self.query_one(TextArea)
            editor.move_cursor((self.result.line - 1, 0))
            editor.focus()

    def action_edit(self) -> None:
        # Focus after this key is fully handled, or the editor would also receive the `e` itself.
        self.call_after_refresh(self.query_one(TextArea).focus)

    def action_leave_editor(self) -> None:
        if self.query_one(TextArea).has_focus:
            self.set_focus(None)
        else:
            self.console.action_switch_screen_to("fleet")

    def action_save(self, say_what_next: bool = True) -> bool:
        if self.console.readonly or self.path is None:
            self.notify("read-only: the profile cannot be saved", severity="warning")
            return False
        text = self.query_one(TextArea).text
        # Checked now, on exactly this text: the last check as-you-type may be of an older text.
        result = check_profile_text(text, self.path, self._state_dir())
        self._show_result(text, result)
        if not result.ok:
            self.notify(f"not saved: {result.describe(self.path)}", severity="error", markup=False)
            return False
        Path(self.path).write_text(text)
        self._saved_text = text
        self._draw_title()
        if say_what_next:
            self._say_what_applying_does()
        return True

    def _say_what_applying_does(self) -> None:
        """After a save: what ctrl+l will do to the running fleet (a dry-run reload), or that it starts it."""
        path = self.path

        def work() -> None:
            try:
                change = self.console.launch_profile_dry_run(path)
            except Exception as exc:  # a refusal is the operator's information
                message, severity = f"saved {path}, but the fleet refuses it: {exc}", "error"
            else:
                if change is None:
                    message, severity = (
                        f"saved {path}; the fleet is not running: ctrl+l starts it",
                        "information",
                    )
                elif (
                    not change["restart"]
                    and not change["start"]
                    and not change["stop"]
                    and not change["fleet"]
                ):
                    message, severity = (
                        f"saved {path}; the fleet already runs it: nothing to apply",
                        "information",
                    )
                else:
                    message, severity = f"saved {path}; ctrl+l applies it: {change['message']}", "warning"
            self.app.call_from_thread(self.notify, message, severity=severity, timeout=12, markup=False)

        self.run_worker(work, thread=True, group="profile-dry-run", exclusive=True, exit_on_error=False)

    def action_plan(self) -> None:
        """Plan the text in the editor (saved or not) against the GPUs of this machine."""
        if self.path is None:
            return
        text, path = self.query_one(TextArea).text, self.path
        self.query_one("#profile-plan", Static).update(Text("asking the probe...", style="dim"))

        def work() -> None:
            plan = plan_profile_text(text, path)
            shown = Text(plan, style="bold red") if isinstance(plan, str) else plan_text(plan)
            self.app.call_from_thread(self.query_one("#profile-plan", Static).update, shown)

        self.run_worker(work, thread=True, group="profile-plan", exclusive=True, exit_on_error=False)

    def action_launch(self) -> None:
        """Apply the saved profile: a running fleet reloads it (after a confirmation that lists what
        changes), a fleet that is not running starts."""
        if self.console.readonly:
            self.notify("read-only: applying and launching are off", severity="warning")
            return
        if not self.action_save(say_what_next=False):
            return
        path = self.path

        def work() -> None:
            try:
                answer = self.console.launch_profile(path)
            except Exception as exc:  # the launch failure is the operator's information, not a crash
                self.app.call_from_thread(
                    self.notify, f"not applied: {exc}", severity="error", timeout=12, markup=False
                )
                return
            if isinstance(answer, dict):
                self.app.call_from_thread(self._confirm_reload, path, answer)
            else:
                self.app.call_from_thread(self.notify, answer)
                self.app.call_from_thread(self.console.poll_now)

        self.notify(f"applying {path} ...")
        self.run_worker(work, thread=True, group="launch", exit_on_error=False)

    def _confirm_reload(self, path: str, change: dict) -> None:
        lines = [f"{s['name']}: {s['change']}" for s in change["servers"] if s["change"] != "unchanged"]
        if not lines and not change["fleet"]:
            self.notify("the fleet already runs this profile: nothing to apply")
            return
        question = "\n".join([*lines, "", change["message"].replace("reload will", "Reload: will"), "Apply?"])
        self.app.push_screen(
            ConfirmScreen(question, confirm_label="Reload"),
            lambda ok: ok and self._reload(path),
        )

    def _reload(self, path: str) -> None:
        def work() -> None:
            try:
                answer = self.console.launch_profile(path, dry_run=False)
                message = answer["message"] if isinstance(answer, dict) else str(answer)
                self.app.call_from_thread(
                    self.notify, message.replace("reload will", "reloading:"), timeout=12, markup=False
                )
            except Exception as exc:
                self.app.call_from_thread(
                    self.notify, f"reload refused: {exc}", severity="error", timeout=12, markup=False
                )
            self.app.call_from_thread(self.console.poll_now)

        self.run_worker(work, thread=True, group="launch", exit_on_error=False)
