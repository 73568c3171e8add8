"""A server's log pump: `python -m console.supervisor.logpump LOG --max-bytes N --backups K`.

The local launcher starts one beside each server process, the server's stdout and stderr on this
process's stdin (a pipe). It copies what arrives into LOG through `LogWriter`, which rotates by size
without losing a line (see logfile.py), and exits when every writer of the pipe has closed it: when
the server and everything it started are gone. It runs in its own session, so a stop of the server's
process group leaves it the time to write the server's last words; it never depends on the
supervisor, so a supervisor crash costs the server nothing. Should it die, the launcher starts another
on the same pipe, whose read end it keeps (console/launchers/log_pump.py): no line is lost.

It imports only the standard library and logfile.py: one runs per server, and its start is on the
path of every server start.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from console.supervisor.logfile import LogWriter

CHUNK = 1 << 16


def pump(source_fd: int, writer: LogWriter) -> None:
    failed = False
    while chunk := os.read(source_fd, CHUNK):
        try:
            writer.write(chunk)
            failed = False
        except OSError as exc:
            # A full disk must not stop the server: keep draining the pipe, drop the lines, say so once.
            if not failed:
                print(f"logpump {writer.path}: lines dropped: {exc}", file=sys.stderr, flush=True)
            failed = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logpump")
    parser.add_argument("log")
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--backups", type=int, required=True)
    args = parser.parse_args(argv)
    with LogWriter(Path(args.log), args.max_bytes, args.backups) as writer:
        pump(sys.stdin.fileno(), writer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
