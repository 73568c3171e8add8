"""Follow a rotated log like `tail -F`: every byte once and in order, across rotations and restarts.

Rotation (logfile.py) renames NAME.log to NAME.log.1, shifting older files up, and starts a new
NAME.log; no write lands in a file after it was renamed away. So when the name points to another
file than the one being read, the follower reads that one to its end, then every file newer than it
(those with a smaller backup number), then goes on in the new NAME.log. Several rotations between
two reads are covered as long as the file being read is still among the backups; a file truncated in
place (rotated by an outside tool) is read again from its start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from console.supervisor.logfile import backup, last_lines, last_lines_of

FileId = tuple[int, int]  # (st_dev, st_ino)

# Snapshots of the file chain retried when a rotation ran while it was taken.
SNAPSHOT_TRIES = 20


def _file_id(f: BinaryIO) -> FileId:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def _path_id(path: Path) -> FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _open(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")  # noqa: SIM115 - kept open across calls, closed by the follower
    except FileNotFoundError:
        return None


def _line_end(f: BinaryIO, end: int, block: int = 1 << 16) -> int:
    """The offset just past the last line end before `end` (0 when there is none)."""
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        cut = f.read(end - start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0


class LogFollower:
    """Reads what is appended to a log over time; `start` first, then `read` as often as wanted."""

    def __init__(self, path: Path):
        self.path = path
        self._file: BinaryIO | None = None
        # With no file open: the newest file already read (None: nothing read yet), and the files that
        # existed when following started (none of them is new).
        self._last: FileId | None = None
        self._known: set[FileId] = set()

    def start(self, lines: int) -> list[str]:
        """The last `lines` lines (reaching into NAME.log.1 when the file is short); reading goes on
        right after them."""
        self._file = _open(self.path)
        if self._file is None:
            chain = self._snapshot()
            self._known = {fid for _, fid in chain}
            for f, _ in chain:
                f.close()
            return []
        # A line still being written is left to the reads that follow, so it is printed whole.
        end = _line_end(self._file, os.fstat(self._file.fileno()).st_size)
        out = last_lines(self._file, end, lines)
        self._file.seek(end)
        if len(out) < lines:
            out = last_lines_of(backup(self.path, 1), lines - len(out)) + out
        return out

    def read(self) -> bytes:
        """Everything written since the last call, in order (b"" when nothing was)."""
        out: list[bytes] = []
        if self._file is not None:
            out.append(self._file.read())
            if _path_id(self.path) == _file_id(self._file):
                if os.fstat(self._file.fileno()).st_size < self._file.tell():
                    self._file.seek(0)  # truncated in place: what is there now is new
                    out.append(self._file.read())
                return b"".join(out)
            # Rotated: what was written before the rename is complete now; read it, then move on.
            out.append(self._file.read())
            self._last = _file_id(self._file)
            self._file.close()
            self._file = None
        chain = self._snapshot()
        ids = [fid for _, fid in chain]
        if self._last in ids:
            newer = chain[ids.index(self._last) + 1 :]
        else:
            # The file last read was rotated out of the backups (or nothing was read yet): every file
            # still there is newer than it, except those that were there from the start.
            newer = [(f, fid) for f, fid in chain if fid not in self._known]
        for f, _ in chain:
            if all(f is not g for g, _ in newer):
                f.close()
        for i, (f, fid) in enumerate(newer):
            out.append(f.read())
            is_current = i == len(newer) - 1 and _path_id(self.path) == fid
            if is_current:
                self._file = f
            else:
                out.append(f.read())  # rotated away while being read: its last writes are in now
                f.close()
                self._last = fid
        return b"".join(out)

    def _snapshot(self) -> list[tuple[BinaryIO, FileId]]:
        """Every file of the log, oldest first, opened; taken again if a rotation moved one meanwhile."""
        for _ in range(SNAPSHOT_TRIES):
            names = [self.path]
            index = 1
            while backup(self.path, index).exists():
                names.append(backup(self.path, index))
                index += 1
            opened = [(name, f) for name in reversed(names) if (f := _open(name)) is not None]
            chain = [(f, _file_id(f)) for _, f in opened]
            if all(_path_id(name) == fid for (name, _), (_, fid) in zip(opened, chain, strict=True)):
                return chain
            for f, _ in chain:
                f.close()
        return []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
