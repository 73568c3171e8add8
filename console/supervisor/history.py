"""A bounded metrics history in SQLite: one row per server per scrape, kept for `retention_s`.

Kept on disk so that after an incident the console (or `sqlite3`) can replay what each server
reported, even if the supervisor itself restarted in between.

Two tables: `samples` (server, t, metrics) holds what a scrape returned; `statuses` (server, t, state,
restarts, pid, started_at) holds what the supervisor knew of the process at that moment, written at
every scrape round for every server, so a crash loop (BACKOFF, FATAL) that has no metrics is still
recorded. `statuses` is a table of its own rather than new columns on `samples`: older history files
keep working as they are, and readers of the three-column `samples` table are unaffected. `events`
(server, t, kind, text) holds what happened to each server, as the supervisor noted it in the server's
log: starts, exits with their reason, restarts, health changes, stalls, drains, reloads, rebalances.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    server TEXT NOT NULL,
    t REAL NOT NULL,
    metrics TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_server_t ON samples (server, t);
CREATE TABLE IF NOT EXISTS statuses (
    server TEXT NOT NULL,
    t REAL NOT NULL,
    state TEXT NOT NULL,
    restarts INTEGER NOT NULL,
    pid INTEGER,
    started_at REAL
);
CREATE INDEX IF NOT EXISTS statuses_server_t ON statuses (server, t);
CREATE TABLE IF NOT EXISTS events (
    server TEXT NOT NULL,
    t REAL NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_t ON events (t);
"""
_TABLES = ("samples", "statuses", "events")


@dataclass(frozen=True)
class ServerStatus:
    """A server's process as the supervisor saw it at one moment (pid/started_at None: no process)."""

    state: str
    restarts: int
    pid: int | None
    started_at: float | None


class MetricsHistory:
    def __init__(self, path: Path, retention_s: float, max_rows: int = 500_000):
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Creating `statuses` here also upgrades a history file written before it existed.
        self._db.executescript(_SCHEMA)
        self.retention_s = retention_s
        self.max_rows = max_rows
        self._inserts = 0
        self.closed = False

    def add(self, server: str, t: float, metrics: dict, status: ServerStatus | None = None) -> None:
        self._db.execute("INSERT INTO samples VALUES (?, ?, ?)", (server, t, json.dumps(metrics)))
        if status is not None:
            self._add_status(server, t, status)
        self._count(t)

    def add_status(self, server: str, t: float, status: ServerStatus) -> None:
        """A moment without metrics (not READY, or the scrape failed): the process state alone."""
        self._add_status(server, t, status)
        self._count(t)

    def _add_status(self, server: str, t: float, status: ServerStatus) -> None:
        self._db.execute(
            "INSERT INTO statuses VALUES (?, ?, ?, ?, ?, ?)",
            (server, t, status.state, status.restarts, status.pid, status.started_at),
        )

    def _count(self, t: float) -> None:
        self._inserts += 1
        if self._inserts % 100 == 0:
            self.prune(t)

    def prune(self, now: float) -> None:
        """Drop rows older than the retention, and the oldest beyond `max_rows` (disk stays bounded)."""
        for table in _TABLES:
            self._db.execute(f"DELETE FROM {table} WHERE t < ?", (now - self.retention_s,))
            (count,) = self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            if count > self.max_rows:
                self._db.execute(
                    f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} ORDER BY t LIMIT ?)",
                    (count - self.max_rows,),
                )

    def add_event(self, server: str, t: float, kind: str, text: str) -> None:
        self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (server, t, kind, text))
        self._count(t)

    def events(self, since: float, until: float | None = None, server: str | None = None) -> list[dict]:
        """Events from `since` to `until` (default: now), oldest first; one server's or every server's.
        None (empty) once the history is closed (the supervisor answers a last /fleet while it shuts down)."""
        if self.closed:
            return []
        sql = "SELECT server, t, kind, text FROM events WHERE t >= ? AND t <= ?"
        args: list = [since, until if until is not None else float("inf")]
        if server is not None:
            sql += " AND server = ?"
            args.append(server)
        rows = self._db.execute(sql + " ORDER BY t", args).fetchall()
        return [{"server": s, "t": t, "kind": k, "text": x} for s, t, k, x in rows]

    def query(self, server: str, since: float) -> list[dict]:
        rows = self._db.execute(
            "SELECT t, metrics FROM samples WHERE server = ? AND t >= ? ORDER BY t", (server, since)
        ).fetchall()
        return [{"t": t, **json.loads(m)} for t, m in rows]

    def statuses(self, server: str, since: float) -> list[tuple[float, ServerStatus]]:
        rows = self._db.execute(
            "SELECT t, state, restarts, pid, started_at FROM statuses WHERE server = ? AND t >= ? ORDER BY t",
            (server, since),
        ).fetchall()
        return [
            (t, ServerStatus(state, restarts, pid, started_at))
            for t, state, restarts, pid, started_at in rows
        ]

    def close(self) -> None:
        self.closed = True
        self._db.close()
