"""A bounded metrics history in SQLite: one row per server per scrape, kept for `retention_s`.

Kept on disk so that after an incident the console (or `sqlite3`) can replay what each server
reported, even if the supervisor itself restarted in between.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    server TEXT NOT NULL,
    t REAL NOT NULL,
    metrics TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_server_t ON samples (server, t);
"""


class MetricsHistory:
    def __init__(self, path: Path, retention_s: float, max_rows: int = 500_000):
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self.retention_s = retention_s
        self.max_rows = max_rows
        self._inserts = 0

    def add(self, server: str, t: float, metrics: dict) -> None:
        self._db.execute("INSERT INTO samples VALUES (?, ?, ?)", (server, t, json.dumps(metrics)))
        self._inserts += 1
        if self._inserts % 100 == 0:
            self.prune(t)

    def prune(self, now: float) -> None:
        """Drop samples older than the retention, and the oldest beyond `max_rows` (disk stays bounded)."""
        self._db.execute("DELETE FROM samples WHERE t < ?", (now - self.retention_s,))
        (count,) = self._db.execute("SELECT COUNT(*) FROM samples").fetchone()
        if count > self.max_rows:
            self._db.execute(
                "DELETE FROM samples WHERE rowid IN (SELECT rowid FROM samples ORDER BY t LIMIT ?)",
                (count - self.max_rows,),
            )

    def query(self, server: str, since: float) -> list[dict]:
        rows = self._db.execute(
            "SELECT t, metrics FROM samples WHERE server = ? AND t >= ? ORDER BY t", (server, since)
        ).fetchall()
        return [{"t": t, **json.loads(m)} for t, m in rows]

    def close(self) -> None:
        self._db.close()
