"""The local launcher: each server process is a subprocess of the supervisor, in its own session.

Its own session (and so process group) lets a stop reach every process the server started, and keeps
the server alive when the supervisor dies: a new supervisor re-adopts it by pid and start time. Each
server process has a log pump beside it, kept running by `log_pump.LogPump` (see there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from console.launchers.base import Launcher, ProcessHandle
from console.launchers.log_pump import LogPump, reopen_stdout_pipe
from console.profile.schema import ProcessSpec, ServerSpec
from console.supervisor.states import REASON_ADOPTED, ExitInfo
from tokenspeed.config.ports import is_port_available


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ChildHandle(ProcessHandle):
    """A process this supervisor spawned: its exit code is ours to read."""

    def __init__(self, popen: subprocess.Popen, node_rank: int, pump: LogPump | None = None):
        self.popen = popen
        self.pid = popen.pid
        self.node_rank = node_rank
        self.create_time = psutil.Process(popen.pid).create_time()
        self.pump = pump

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
        return _record(self)


def _record(handle: ChildHandle | AdoptedHandle) -> dict:
    record = {"pid": handle.pid, "create_time": handle.create_time, "node_rank": handle.node_rank}
    pump = handle.pump.record() if handle.pump is not None else None
    if pump is not None:
        record["log_pump"] = pump
    return record


class AdoptedHandle(ProcessHandle):
    """A process a previous supervisor spawned: alive is knowable, its exit code is not."""

    def __init__(self, process: psutil.Process, node_rank: int, pump: LogPump | None = None):
        self.process = process
        self.pid = process.pid
        self.node_rank = node_rank
        self.create_time = process.create_time()
        self.pump = pump

    def _alive(self) -> bool:
        try:
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def poll(self) -> ExitInfo | None:
        if self._alive():
            return None
        signal_group(self.pid, signal.SIGKILL)
        return ExitInfo(None, None, time.time(), REASON_ADOPTED)

    def signal_group(self, sig: signal.Signals) -> None:
        if self._alive():
            signal_group(self.pid, sig)

    def record(self) -> dict:
        return _record(self)


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
    return not is_port_available(port, host)


class LocalLauncher(Launcher):
    def __init__(self, command: tuple[str, ...] | None = None, log_max_bytes: int = 0, log_backups: int = 0):
        super().__init__(command)
        self.log_max_bytes, self.log_backups = log_max_bytes, log_backups
        self._pumps: list[LogPump] = []

    def start(self, server: ServerSpec, process: ProcessSpec, log_path: Path) -> ProcessHandle:
        if process.node_rank == 0 and port_in_use(server.host, server.port):
            raise RuntimeError(f"port {server.port} on {server.host} is already in use by another process")
        env = {**os.environ, **dict(process.env), "TOKENSPEED_SERVER_NAME": server.name}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The server writes into a pipe; its log pump (own session, see console/supervisor/logpump.py)
        # owns the file and rotates it without losing lines. The write end closes here once the server
        # runs, so the pump sees the end of the pipe exactly when the server's last process is gone;
        # the read end stays here too, for a new pump should this one die (log_pump.py).
        read_end, write_end = os.pipe()
        try:
            pump = LogPump(read_end, log_path, self.log_max_bytes, self.log_backups, server.name)
        except BaseException:
            os.close(read_end)
            os.close(write_end)
            raise
        self._pumps.append(pump)
        try:
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
            os.close(write_end)
        return ChildHandle(popen, process.node_rank, pump)

    def tend_log_pumps(self) -> None:
        for pump in self._pumps:
            pump.tend()
        self._pumps = [p for p in self._pumps if not p.finished]

    def close(self) -> None:
        for pump in self._pumps:
            pump.close()
        self._pumps = []

    def adopt(
        self, server: ServerSpec, process: ProcessSpec, record: dict, log_path: Path
    ) -> ProcessHandle | None:
        found = find_process(int(record["pid"]), float(record["create_time"]))
        if found is None:
            return None
        return AdoptedHandle(found, process.node_rank, self._adopt_pump(found.pid, record, log_path, server))

    def _adopt_pump(self, pid: int, record: dict, log_path: Path, server: ServerSpec) -> LogPump | None:
        """Watch the pump of an adopted server again (or start one if it died meanwhile)."""
        read_end = reopen_stdout_pipe(pid)
        if read_end is None:
            return None  # not a pipe (a server of an older supervisor): its log is not ours to keep
        saved = record.get("log_pump") or {}
        running = find_process(int(saved["pid"]), float(saved["create_time"])) if saved else None
        if running is None:
            pump = LogPump(read_end, log_path, self.log_max_bytes, self.log_backups, server.name)
        else:
            pump = LogPump(read_end, log_path, self.log_max_bytes, self.log_backups, server.name, running)
        self._pumps.append(pump)
        return pump
