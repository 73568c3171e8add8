"""Where a fleet's supervisor keeps its state: `$XDG_STATE_HOME/tokenspeed/<fleet>/` unless told otherwise.

control.sock      HTTP control API on a unix socket (0600; the directory itself is 0700)
state.json        servers, their states and process identities (what a new supervisor re-adopts)
supervisor.pid    {"pid", "create_time"} of the running supervisor
supervisor.lock   held (flock) while a supervisor runs: one per state directory
supervisor.log    the supervisor's own log
history.sqlite    metrics history
logs/NAME.log     one log per server, rotated by size
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


def state_root() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "tokenspeed"


def default_state_dir(fleet_name: str) -> Path:
    return state_root() / fleet_name


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def socket(self) -> Path:
        return self.root / "control.sock"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "supervisor.pid"

    @property
    def lock_file(self) -> Path:
        return self.root / "supervisor.lock"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    @property
    def history(self) -> Path:
        return self.root / "history.sqlite"

    def log(self, server: str) -> Path:
        return self.root / "logs" / f"{server}.log"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        (self.root / "logs").mkdir(exist_ok=True, mode=0o700)
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"state directory {self.root} is too long for a unix socket path; use a shorter --state-dir"
            )
