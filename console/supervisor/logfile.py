"""Per-server log files: the server writes its own file, the supervisor rotates it by size.

The server process holds the file open itself (O_APPEND) rather than writing through a pipe to the
supervisor, so a supervisor crash never blocks or kills a server on its next log line. Rotation is
therefore copy-then-truncate: with O_APPEND the writer's next line lands at the new end of the file.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from pathlib import Path


def open_for_child(path: Path) -> int:
    """A file descriptor for a child's stdout and stderr (the caller closes its copy after spawning)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def rotate_if_needed(path: Path, max_bytes: int, backups: int) -> bool:
    """Rotate `path` to `path.1` (shifting older ones up to `backups`) once it reaches `max_bytes`."""
    try:
        if path.stat().st_size < max_bytes:
            return False
    except FileNotFoundError:
        return False
    if backups > 0:
        for i in range(backups - 1, 0, -1):
            older = path.with_name(f"{path.name}.{i}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
        shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    with open(path, "r+b") as f:
        f.truncate(0)
    return True


def append_line(path: Path, line: str) -> None:
    """A supervisor note in the server's log (start, exit, restart), so one file tells the story."""
    fd = open_for_child(path)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the log, reaching into the newest backup when the file was just rotated."""
    out: deque[str] = deque(maxlen=max(lines, 0))
    for candidate in (path.with_name(f"{path.name}.1"), path):
        try:
            with open(candidate, errors="replace") as f:
                for line in f:
                    out.append(line.rstrip("\n"))
        except FileNotFoundError:
            continue
    return list(out)
