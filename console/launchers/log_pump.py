"""A server process's log pump, kept running for as long as the server can write a line.

The server writes into a pipe; its pump (`console.supervisor.logpump`, its own process) copies the
pipe into the server's log file. The launcher keeps its own copy of the pipe's read end, so a pump
that dies (killed, out of memory) loses nothing: the server's writes wait in the pipe (or, once the
pipe is full, the server waits) until `tend()` starts a new pump on the same read end, which goes on
from the first byte the dead one did not read.

When does a pump stop for good? When the pipe has no writer left and nothing left to read: the
server and everything it started are gone (poll() on the read end reports POLLHUP without POLLIN).
Until then an ended pump, whatever its exit status, is replaced.

A supervisor that restarts finds the pipe again through `/proc/<server pid>/fd/1` (the server's
stdout, the write end: opened read-only it is a new read end of the same pipe) and the running pump
by the pid and start time saved in the state file.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

from console.supervisor.logfile import supervisor_note

# A pump that keeps dying at once (log directory gone, disk full at open) is retried with backoff.
_QUICK_DEATH_S = 5.0
_RETRY_MAX_S = 30.0


def reopen_stdout_pipe(pid: int) -> int | None:
    """A new read end of the pipe process `pid` writes its stdout into, or None (gone, not a pipe)."""
    try:
        fd = os.open(f"/proc/{pid}/fd/1", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    # The pump reads blocking; O_NONBLOCK was only there so the open never waits for a writer.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    os.set_inheritable(fd, False)
    return fd


class LogPump:
    """One pump and the read end it pumps from (owned: closed once the pipe is drained)."""

    def __init__(
        self,
        read_fd: int,
        log_path: Path,
        max_bytes: int,
        backups: int,
        server_name: str,
        adopted: psutil.Process | None = None,
    ):
        self.read_fd: int | None = read_fd
        self.log_path, self.max_bytes, self.backups = log_path, max_bytes, backups
        self.server_name = server_name
        self.popen: subprocess.Popen | None = None
        self.process: psutil.Process | None = adopted  # a pump an earlier supervisor started
        self.started_at = time.monotonic()
        self.retries = 0
        self.next_try_at = 0.0
        if adopted is None:
            self._spawn()

    @property
    def pid(self) -> int | None:
        if self.popen is not None:
            return self.popen.pid
        return self.process.pid if self.process is not None else None

    def record(self) -> dict | None:
        """Identity for the state file, so a later supervisor can watch this same pump."""
        try:
            proc = psutil.Process(self.pid) if self.pid else None
            return {"pid": proc.pid, "create_time": proc.create_time()} if proc else None
        except psutil.NoSuchProcess:
            return None

    def _spawn(self) -> None:
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "console.supervisor.logpump",
                str(self.log_path),
                "--max-bytes",
                str(self.max_bytes),
                "--backups",
                str(self.backups),
            ],
            stdin=self.read_fd,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        self.process = None
        self.started_at = time.monotonic()

    def _ended(self) -> str | None:
        """None while the pump runs, else how it ended."""
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return None
            return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        try:
            if (
                self.process is not None
                and self.process.is_running()
                and self.process.status() != psutil.STATUS_ZOMBIE
            ):
                return None
        except psutil.NoSuchProcess:
            pass
        return "exit status unknown"

    def _pipe_done(self) -> bool:
        """No writer left and nothing left to read."""
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        events = dict(poller.poll(0)).get(self.read_fd, 0)
        return bool(events & select.POLLHUP) and not events & select.POLLIN

    @property
    def finished(self) -> bool:
        return self.read_fd is None

    def tend(self) -> None:
        """Replace the pump if it ended while its server can still write; let go once all is read."""
        if self.read_fd is None:
            return
        how = self._ended()
        if how is None:
            return
        if self._pipe_done():
            self.close()
            return
        now = time.monotonic()
        if now < self.next_try_at:
            return
        quick = now - self.started_at < _QUICK_DEATH_S
        self.retries = self.retries + 1 if quick else 0
        self.next_try_at = now + (min(2.0 ** (self.retries - 1), _RETRY_MAX_S) if self.retries else 0.0)
        self._spawn()
        supervisor_note(
            self.log_path, self.server_name, f"log pump ended ({how}): restarted (pid {self.popen.pid})"
        )

    def close(self) -> None:
        """Let go of the read end (the pump, if running, keeps its own and ends by itself)."""
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None
        if self.popen is not None:
            self.popen.poll()  # collect a pump that ended, so none stays a zombie
