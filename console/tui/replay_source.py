"""Replay: the console over a supervisor's recorded state directory (history.sqlite, state.json, logs/).

Shows the fleet as it was at one moment (`--at`), movable with `[`/`]`; every action is off.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
import threading
from collections import deque
from pathlib import Path
from typing import Any

from console.tui.model import EVENTS_SECONDS, EVENTS_SHOWN, Fleet, History, Server
from console.tui.source import DataSource, SourceError

# A server with no sample this close before the replay time is shown as not reporting.
STALE_AFTER_S = 5.0
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smh]?)$")


def parse_at(text: str | None, start: float, end: float) -> float:
    """`--at`: unix seconds, an ISO date-time, HH:MM[:SS] on the recording's last day, or -N[s|m|h] from its end."""
    if text is None or text == "":
        return end
    text = text.strip()
    match = _RELATIVE.match(text)
    if match:
        scale = {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
        return end - float(match.group(1)) * scale
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
        return when.timestamp() if when.tzinfo else when.astimezone().timestamp()
    except ValueError:
        pass
    try:
        clock = dt.time.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--at {text!r}: give unix seconds, an ISO time (2026-01-31T10:30:00), HH:MM:SS, or -5m"
        ) from None
    day = dt.datetime.fromtimestamp(end).date()
    return dt.datetime.combine(day, clock).timestamp()


class ReplaySource(DataSource):
    readonly = True

    def __init__(self, state_dir: str | Path, at: str | None = None) -> None:
        self.root = Path(state_dir)
        db_path = self.root / "history.sqlite"
        if not db_path.is_file():
            raise ValueError(
                f"--replay {state_dir}: no history.sqlite there (is it a fleet's state directory?)"
            )
        self._lock = threading.Lock()
        self._db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, check_same_thread=False)
        try:
            # Histories written before the supervisor recorded process states have no `statuses` table.
            self._has_statuses = bool(
                self._db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'statuses'"
                ).fetchone()
            )
            start, end = self._db.execute(
                "SELECT MIN(t), MAX(t) FROM (SELECT t FROM samples"
                + (" UNION ALL SELECT t FROM statuses)" if self._has_statuses else ")")
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"--replay {state_dir}: history.sqlite is unreadable: {exc}") from exc
        if start is None:
            raise ValueError(f"--replay {state_dir}: the history holds no samples yet")
        self.start, self.end = float(start), float(end)
        self._at = min(max(parse_at(at, self.start, self.end), self.start), self.end)
        self._layout = self._read_layout()
        self._servers = self._server_layout()

    def _read_layout(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / "state.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def label(self) -> str:
        return f"replay of {self.root}"

    @property
    def now(self) -> float:
        return self._at

    def seek(self, delta_s: float) -> None:
        self._at = min(max(self._at + delta_s, self.start), self.end)

    def _rows(self, sql: str, args: tuple) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as exc:
                raise SourceError(f"history: {exc}") from exc

    def _server_layout(self) -> dict[str, dict[str, Any]]:
        """What the recording says about each server (state.json), plus its place from the profile."""
        servers = self._layout.get("servers") or []
        by_name = {str(s["name"]): dict(s) for s in servers if isinstance(s, dict) and s.get("name")}
        for spec in self._profile_specs():
            entry = by_name.setdefault(spec.name, {"name": spec.name})
            entry.update(
                replica=spec.replica,
                node=spec.node,
                gpus=list(spec.gpus),
                host=spec.host,
                port=spec.port,
                url=spec.url,
            )
        return by_name

    def _profile_specs(self) -> list[Any]:
        path = self._layout.get("profile_path")
        if not path or not Path(path).is_file():
            return []
        try:
            from console.profile.fleet import load_and_resolve

            return list(load_and_resolve(path).servers)
        except Exception:  # a profile edited since the recording: show names from the history alone
            return []

    def fleet(self) -> Fleet:
        at = self._at
        layout = self._servers
        names = {r[0] for r in self._rows("SELECT DISTINCT server FROM samples", ())}
        if self._has_statuses:
            names |= {r[0] for r in self._rows("SELECT DISTINCT server FROM statuses", ())}
        servers = []
        for name in sorted(names | set(layout)):
            row = self._rows(
                "SELECT t, metrics FROM samples WHERE server = ? AND t <= ? ORDER BY t DESC LIMIT 1",
                (name, at),
            )
            status = self._status_at(name, at)
            if status is None:
                servers.append(self._server_at(name, layout.get(name, {}), row[0] if row else None, at))
            else:
                servers.append(
                    self._server_with_status(name, layout.get(name, {}), row[0] if row else None, status, at)
                )
        return Fleet(
            name=str(self._layout.get("fleet") or self._layout.get("name") or self.root.name),
            profile_path=self._layout.get("profile_path"),
            state_dir=str(self.root),
            started_at=self._layout.get("started_at"),
            servers=tuple(Server.from_json(s) for s in servers),
            events=tuple(self.events(EVENTS_SECONDS)[-EVENTS_SHOWN:]),
        )

    @staticmethod
    def _server_at(name: str, layout: dict[str, Any], row: tuple | None, at: float) -> dict[str, Any]:
        keep = ("name", "replica", "node", "gpus", "host", "port", "url", "restarts", "last_exit")
        data = {k: layout[k] for k in keep if k in layout}
        data["name"] = name
        started = layout.get("started_at")
        if isinstance(started, (int, float)) and started <= at:
            data["uptime_s"] = at - started
        if row is None or at - row[0] > STALE_AFTER_S:
            data.update(state="STOPPED", healthy=False, metrics=None, error="no sample at this time")
            return data
        t, blob = row
        data.update(state="READY", healthy=True, metrics=json.loads(blob), scraped_at=t)
        return data

    def _status_at(self, name: str, at: float) -> tuple | None:
        """The last recorded process status of `name` at or before `at`.

        None for older recordings, and before the first status of a history that a newer supervisor
        carried on: those moments are shown from the metrics samples alone, as they always were.
        """
        if not self._has_statuses:
            return None
        rows = self._rows(
            "SELECT t, state, restarts, pid, started_at FROM statuses "
            "WHERE server = ? AND t <= ? ORDER BY t DESC LIMIT 1",
            (name, at),
        )
        return rows[0] if rows else None

    @staticmethod
    def _server_with_status(
        name: str, layout: dict[str, Any], row: tuple | None, status: tuple, at: float
    ) -> dict[str, Any]:
        """A server at `at` from the supervisor's own record of its state, restarts and process."""
        keep = ("name", "replica", "node", "gpus", "host", "port", "url", "last_exit")
        data = {k: layout[k] for k in keep if k in layout}
        data["name"] = name
        t, state, restarts, pid, started_at = status
        if at - t > STALE_AFTER_S:
            # No status this close: the supervisor itself was not running at this time.
            data.update(
                state="STOPPED",
                healthy=False,
                metrics=None,
                restarts=restarts,
                error="no sample at this time",
            )
            return data
        data.update(state=state, healthy=state == "READY", restarts=restarts, pid=pid, metrics=None)
        if started_at is not None and started_at <= at:
            data["started_at"] = started_at
            data["uptime_s"] = at - started_at
        # Metrics only from a scrape within the same moment: a BACKOFF server shows none.
        if row is not None and at - row[0] <= STALE_AFTER_S and row[0] >= t - 1e-6:
            data.update(metrics=json.loads(row[1]), scraped_at=row[0])
        return data

    def history(self, server: str, seconds: float) -> History:
        rows = self._rows(
            "SELECT t, metrics FROM samples WHERE server = ? AND t > ? AND t <= ? ORDER BY t",
            (server, self._at - seconds, self._at),
        )
        return History.from_json({"samples": [{"t": t, **json.loads(m)} for t, m in rows]})

    def raw_metrics(self, server: str) -> str:
        raise SourceError("replay: the history keeps summaries, not raw /metrics pages")

    def info(self, server: str) -> dict[str, Any]:
        raise SourceError("replay: server info is only available from a live server")

    def logs(self, server: str, lines: int) -> list[str]:
        path = self.root / "logs" / f"{server}.log"
        try:
            with path.open(errors="replace") as f:
                return [line.rstrip("\n") for line in deque(f, maxlen=lines)]
        except OSError as exc:
            raise SourceError(f"log of {server}: {exc.strerror or exc}") from exc

    def events(self, seconds: float) -> list[dict[str, Any]]:
        """The recorded events up to the replay's moment (none in a history written before events were)."""
        try:
            rows = self._rows(
                "SELECT server, t, kind, text FROM events WHERE t >= ? AND t <= ? ORDER BY t",
                (self.now - seconds, self.now),
            )
        except SourceError:
            return []
        return [{"server": s, "t": t, "kind": k, "text": x} for s, t, k, x in rows]

    def probe(self) -> dict[str, Any]:
        raise SourceError("replay: the GPU probe only runs against live machines")

    def close(self) -> None:
        with self._lock:
            self._db.close()
