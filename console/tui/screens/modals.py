"""Modal dialogs: confirmation of destructive actions, the key help, and leaving a fleet the console started."""

from __future__ import annotations

from rich.table import Table
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no; `y` or enter on the button confirms, `n` or esc cancels. Defaults to No (focus on Cancel)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, question: str, confirm_label: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.confirm_label = confirm_label

    def compose(self):
        with Vertical(id="dialog", classes="dialog"):
            yield Label(self.question, id="question")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.confirm_label} (y)", variant="error", id="yes")
                yield Button("Cancel (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class LeaveScreen(ModalScreen[str | None]):
    """Leaving a console that started its fleet: keep the fleet running, stop it, or stay."""

    BINDINGS = [
        Binding("k", "answer('keep')", "Keep running"),
        Binding("s", "answer('stop')", "Stop fleet"),
        Binding("escape", "answer(None)", "Stay"),
    ]

    def compose(self):
        with Vertical(id="dialog", classes="dialog"):
            yield Label("This console started the fleet. Leave it running?", id="question")
            with Horizontal(classes="buttons"):
                yield Button("Keep running (k)", variant="primary", id="keep")
                yield Button("Stop the fleet (s)", variant="error", id="stop")
                yield Button("Stay (esc)", id="stay")

    def on_mount(self) -> None:
        self.query_one("#keep", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "stay" else event.button.id)

    def action_answer(self, value: str | None) -> None:
        self.dismiss(value)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close"),
        Binding("q", "close", "Close"),
    ]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self):
        table = Table(title="Keys", show_header=False, box=None, padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        seen = set()
        for key, text in self.rows:
            if (key, text) in seen:
                continue
            seen.add((key, text))
            table.add_row(key, text)
        with Vertical(id="help", classes="dialog"):
            yield Static(table)
            yield Label("esc closes", classes="dim")

    def action_close(self) -> None:
        self.dismiss(None)
