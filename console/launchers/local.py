"""The local launcher: each server process is a subprocess of the supervisor, in its own session.

Its own session (and so process group) lets a stop reach every process the server started, and keeps
the server alive when the supervisor dies: a new supervisor re-adopts it by pid and start time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from console.launchers.base import Launcher, ProcessHandle
from console.profile_schema import ProcessSpec, ServerSpec
from console.supervisor.states import ExitInfo


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ChildHandle(ProcessHandle):
    """A process this supervisor spawned: its exit code is ours to read."""

    def __init__(self, popen: subprocess.Popen, node_rank: int):
        self.popen = popen
        self.pid = popen.pid
        self.node_rank = node_rank
        self.create_time = psutil.Process(popen.pid).create_time()

    def poll(self) -> ExitInfo | None:
        code = self.popen.poll()
        if code is None:
            return None
        # Leftovers of the group (ranks the server started) must not outlive it.
        signal_group(self.pid, signal.SIGKILL)
        return ExitInfo.from_returncode(code, time.time())

    def signal_group(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            signal_group(self.pid, sig)

    def record(self) -> dict:
        return {"pid": self.pid, "create_time": self.create_time, "node_rank": self.node_rank}


class AdoptedHandle(ProcessHandle):
    """A process a previous supervisor spawned: alive is knowable, its exit code is not."""

    def __init__(self, process: psutil.Process, node_rank: int):
        self.process = process
        self.pid = process.pid
        self.node_rank = node_rank
        self.create_time = process.create_time()

    def _alive(self) -> bool:
        try:
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def poll(self) -> ExitInfo | None:
        if self._alive():
            return None
        signal_group(self.pid, signal.SIGKILL)
        return ExitInfo(None, None, time.time())

    def signal_group(self, sig: signal.Signals) -> None:
        if self._alive():
            signal_group(self.pid, sig)

    def record(self) -> dict:
        return {"pid": self.pid, "create_time": self.create_time, "node_rank": self.node_rank}


def find_process(pid: int, create_time: float) -> psutil.Process | None:
    """The process `pid` if it is still the one started at `create_time` (pids are reused)."""
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) > 0.05 or process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port (a health check there would answer for it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class LocalLauncher(Launcher):
    def __init__(self, command: tuple[str, ...] | None = None, log_max_bytes: int = 0, log_backups: int = 0):
        super().__init__(command)
        self.log_max_bytes, self.log_backups = log_max_bytes, log_backups
        self._pumps: list[subprocess.Popen] = []

    def start(self, server: ServerSpec, process: ProcessSpec, log_path: Path) -> ProcessHandle:
        if process.node_rank == 0 and port_in_use(server.host, server.port):
            raise RuntimeError(f"port {server.port} on {server.host} is already in use by another process")
        env = {**os.environ, **dict(process.env), "TOKENSPEED_SERVER_NAME": server.name}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The server writes into a pipe; its log pump (own session, see console/supervisor/logpump.py)
        # owns the file and rotates it without losing lines. Both ends close here once both run, so the
        # pump sees the end of the pipe exactly when the server's last process is gone.
        read_end, write_end = os.pipe()
        try:
            pump = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "console.supervisor.logpump",
                    str(log_path),
                    "--max-bytes",
                    str(self.log_max_bytes),
                    "--backups",
                    str(self.log_backups),
                ],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            self._pumps.append(pump)
            popen = subprocess.Popen(
                [*self.command, *process.argv],
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(read_end)
            os.close(write_end)
        return ChildHandle(popen, process.node_rank)

    def poll_logs(self) -> None:
        # Pumps end on their own after their server; collect their exit status so none stays a zombie.
        self._pumps = [p for p in self._pumps if p.poll() is None]

    def adopt(
        self, server: ServerSpec, process: ProcessSpec, record: dict, log_path: Path
    ) -> ProcessHandle | None:
        found = find_process(int(record["pid"]), float(record["create_time"]))
        return None if found is None else AdoptedHandle(found, process.node_rank)
