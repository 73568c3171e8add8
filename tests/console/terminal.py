"""A real terminal for the console tests: `tokenspeed console` in a tmux session, read as a person sees it."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Terminal:
    """One tmux session running a command; `screen()` is what a person would see."""

    def __init__(self, command: str, width: int = 160, height: int = 45) -> None:
        self.name = f"tsc-{uuid.uuid4().hex[:8]}"
        # Keep the pane after the command exits, so its last words can be read.
        # COLUMNS/LINES left by a test runner would override the real terminal size.
        wrapped = f"env -u COLUMNS -u LINES {command}; echo EXIT=$?; sleep 120"
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                str(width),
                "-y",
                str(height),
                "-c",
                str(REPO),
                wrapped,
            ],
            check=True,
        )
        # A detached session may start at the server's default size; pin the one asked for.
        subprocess.run(
            ["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)],
            capture_output=True,
        )

    def screen(self) -> str:
        result = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        )
        return result.stdout

    def send(self, *keys: str) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.15)

    def wait_for(self, *texts: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(text in screen for text in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{texts} not on screen after {timeout}s; screen:\n{screen}")

    def wait_gone(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text not in self.screen():
                return
            time.sleep(0.1)
        raise AssertionError(f"{text!r} still on screen after {timeout}s")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)
