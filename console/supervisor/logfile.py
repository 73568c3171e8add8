"""Per-server log files, rotated by size without losing a line.

A server's stdout and stderr go into a pipe read by its own log pump (`console.supervisor.logpump`, a
small process beside the server, not the supervisor), so a supervisor crash never blocks or kills a
server on its next log line. The pump, the supervisor's own notes and the Ray launcher's relay all
write through `LogWriter`; rotation renames `NAME.log` to `NAME.log.1` (older ones shift up to
`backups`) and starts a new file.

Why not copy-then-truncate under a writer that holds the file: every line written between the copy
and the truncate is lost, and a reader cannot tell. Here every write and every rotation take a lock
(`.NAME.log.lock`, shared for writes, exclusive for rotation), and a writer looks up the file the
name points at inside its shared lock, so no write lands in a file after it was renamed away. A
reader that sees the name point to a new file can therefore read the old one to its end and go on
with the newer ones (`logfollow.LogFollower`) without missing or repeating a byte.

Invariant: the files, oldest first, are NAME.log.<backups> ... NAME.log.1, NAME.log; each was once
NAME.log; each ends at a line end unless a line grew past twice max_bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def backup(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


@contextlib.contextmanager
def _locked(lock_fd: int, exclusive: bool) -> Iterator[None]:
    fcntl.flock(lock_fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class LogWriter:
    """Appends to a rotated log, each write into the file the name points at now; rotates by size."""

    def __init__(self, path: Path, max_bytes: int, backups: int):
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
        self._fd: int | None = None
        self._size = 0  # of the file written last, as of that write

    def write(self, data: bytes) -> None:
        """Append `data`; a long chunk is cut at line ends so each file ends near `max_bytes`."""
        while data:
            piece = data
            room = self.max_bytes - self._size
            if self.max_bytes > 0 and len(data) > room:
                cut = data.rfind(b"\n", 0, max(room, 0))
                cut = cut if cut >= 0 else data.find(b"\n", max(room, 0))
                if cut >= 0:
                    piece = data[: cut + 1]
            self._append(piece)
            data = data[len(piece) :]
            if self.max_bytes > 0 and self._size >= self.max_bytes:
                rotate_if_needed(self.path, self.max_bytes, self.backups, self._lock)

    def _append(self, data: bytes) -> None:
        with _locked(self._lock, exclusive=False):
            if self._fd is None or not _same_file(self._fd, self.path):
                self._close_file()
                self._fd = _open_append(self.path)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self._size = os.fstat(self._fd).st_size

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close_file()
        os.close(self._lock)

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def rotate_if_needed(path: Path, max_bytes: int, backups: int, lock_fd: int | None = None) -> bool:
    """Rename `path` to `path.1` (shifting older ones up to `backups`) once it reaches `max_bytes`.

    A file that does not end at a line end waits for the end of its line (up to twice `max_bytes`),
    so a line is never split across two files.
    """
    try:
        if os.stat(path).st_size < max_bytes:
            return False  # the common case, decided without the lock that holds up writers
    except FileNotFoundError:
        return False
    own_lock = lock_fd is None
    if own_lock:
        try:
            lock_fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # no log directory yet: nothing to rotate
            return False
    try:
        with _locked(lock_fd, exclusive=True):
            return _rotate_locked(path, max_bytes, backups)
    finally:
        if own_lock:
            os.close(lock_fd)


def _rotate_locked(path: Path, max_bytes: int, backups: int) -> bool:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < max_bytes or size == 0:
                return False
            f.seek(size - 1)
            if f.read(1) != b"\n" and size < 2 * max_bytes:
                return False
    except FileNotFoundError:
        return False
    if backups > 0:
        for i in range(backups - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(backup(path, i), backup(path, i + 1))
        os.replace(path, backup(path, 1))
    else:
        path.unlink()
    # The new file exists before the lock is released: a reader never waits on a missing name.
    os.close(_open_append(path))
    return True


def append(path: Path, data: bytes) -> None:
    """One write into the log from outside its pump (under the lock: never into a file renamed away);
    rotation is left to the supervisor's tick."""
    with LogWriter(path, max_bytes=0, backups=0) as writer:
        writer.write(data)


def append_line(path: Path, line: str) -> None:
    """A supervisor note in the server's log (start, exit, restart), so one file tells the story."""
    append(path, (line.rstrip("\n") + "\n").encode())


def supervisor_note(path: Path, server: str, message: str) -> None:
    """`[supervisor 2026-01-02 03:04:05] NAME: message` in the server's log."""
    append_line(path, f"[supervisor {time.strftime('%Y-%m-%d %H:%M:%S')}] {server}: {message}")


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the log, reaching into the newest backup when the file was just rotated.

    Read from the end in blocks: the console asks every second, and a log may be tens of MiB.
    """
    if lines <= 0:
        return []
    out: list[str] = []
    for candidate in (path, backup(path, 1)):
        out = last_lines_of(candidate, lines - len(out)) + out
        if len(out) >= lines:
            break
    return out


def last_lines_of(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the file at `path` ([] when there is none)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return []
    with f:
        return last_lines(f, os.fstat(f.fileno()).st_size, lines)


def last_lines(f: BinaryIO, end: int, lines: int, block: int = 1 << 16) -> list[str]:
    """The last `lines` lines of `f` before offset `end`, read backwards in blocks."""
    if lines <= 0:
        return []
    data = b""
    while end > 0 and data.count(b"\n") <= lines:
        start = max(0, end - block)
        f.seek(start)
        data = f.read(end - start) + data
        end = start
    return data.decode(errors="replace").splitlines()[-lines:]
