"""Live data: a running fleet's supervisor, through its control API (`console.client.SupervisorClient`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from console.client import SupervisorClient, SupervisorError, SupervisorUnavailable
from console.tui.model import Fleet, History
from console.tui.source import FLEET_ACTIONS, SERVER_ACTIONS, DataSource, SourceError, SourceUnreachable


class LiveSource(DataSource):
    def __init__(self, state_dir: str | Path, timeout: float = 3.0) -> None:
        self.state_dir = Path(state_dir)
        self._client = SupervisorClient(self.state_dir, timeout=timeout)

    @property
    def label(self) -> str:
        return f"supervisor at {self.state_dir}"

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except SupervisorUnavailable as exc:
            raise SourceUnreachable(f"{what}: {exc}") from exc
        except SupervisorError as exc:  # it answered, with an error of its own
            raise SourceError(f"{what}: {exc}") from exc
        except OSError as exc:  # a socket error the client did not map (it maps its own to SupervisorUnavailable)
            raise SourceUnreachable(f"{what}: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:  # it answered, but not with JSON (a torn answer, another program)
            raise SourceError(f"{what}: not JSON ({type(exc).__name__}: {exc})") from exc

    def fleet(self) -> Fleet:
        data = self._call("fleet", self._client.fleet)
        if not isinstance(data, dict):
            raise SourceError("fleet: the supervisor answered something that is not a fleet")
        try:
            return Fleet.from_json(data)
        except (TypeError, ValueError, AttributeError) as exc:  # another version's fields, say
            raise SourceError(f"fleet: not a fleet this console reads ({type(exc).__name__}: {exc})") from exc

    def history(self, server: str, seconds: float) -> History:
        return History.from_json(self._call(f"history of {server}", self._client.history, server, seconds))

    def raw_metrics(self, server: str) -> str:
        return self._call(f"metrics of {server}", self._client.raw_metrics, server)

    def info(self, server: str) -> dict[str, Any]:
        return self._call(f"info of {server}", self._client.info, server)

    def expert_placement(self, server: str) -> dict[str, Any]:
        return self._call(f"expert placement of {server}", self._client.expert_placement, server)

    def logs(self, server: str, lines: int) -> list[str]:
        data = self._call(f"log of {server}", self._client.logs, server, lines)
        return [str(line) for line in (data or {}).get("lines") or []]

    def events(self, seconds: float) -> list[dict[str, Any]]:
        data = self._call("events", self._client.events, seconds)
        return [e for e in (data or {}).get("events") or [] if isinstance(e, dict)]

    def probe(self) -> dict[str, Any]:
        return self._call("probe", self._client.probe)

    def action(self, name: str, server: str | None = None) -> Any:
        # An error names only what it concerns (the fleet or the server); the caller's notice names the action.
        if name in FLEET_ACTIONS:
            return self._call("fleet", getattr(self._client, name))
        if name not in SERVER_ACTIONS or server is None:
            raise SourceError(f"{name}: not an action the console knows")
        return self._call(server, self._client.server_action, server, name)

    def shutdown(self) -> None:
        self._call("shutdown", self._client.shutdown)

    def close(self) -> None:
        self._client.close()
