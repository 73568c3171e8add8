"""A synchronous client of the supervisor's control API (see console/supervisor/api.py for the routes).

    client = SupervisorClient(find_state_dir("demo"))
    for server in client.fleet()["servers"]: ...

Every call has a short timeout: a console polling a stuck supervisor must not hang. Failures raise
`SupervisorUnavailable` (nothing answers on the socket) or `SupervisorError` (it answered with an error).
"""

from __future__ import annotations

import http.client
from pathlib import Path

from console.supervisor.paths import StatePaths, default_state_dir, state_root
from console.unix_http import Answer, UnixHTTP

# A server action's route under /servers/NAME/ (console/supervisor/api.py), by the name the console gives it.
SERVER_ROUTES = {
    "restart": "restart",
    "stop": "stop",
    "start": "start",
    "flush_cache": "flush_cache",
    "expert_record_start": "expert_record/start",
    "expert_record_stop": "expert_record/stop",
    "rebalance_experts": "rebalance_experts",
}
# Moving expert weights can outlast the short default timeout on a busy server.
_ACTION_TIMEOUT_S = {"rebalance_experts": 150.0}


class SupervisorError(RuntimeError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class SupervisorUnavailable(SupervisorError):
    pass


def list_state_dirs() -> list[Path]:
    """State directories under the default root that have a control socket (running or crashed)."""
    root = state_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if StatePaths(p).socket.exists())


def find_state_dir(fleet_name: str | None = None, state_dir: str | Path | None = None) -> Path:
    """The state directory of a fleet: explicit, by name, or the only one with a socket."""
    if state_dir is not None:
        return Path(state_dir).resolve()
    if fleet_name is not None:
        return default_state_dir(fleet_name)
    candidates = list_state_dirs()
    if not candidates:
        raise SupervisorUnavailable(f"no running fleet under {state_root()}; start one with `tokenspeed up`")
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise SupervisorError(f"several fleets are running ({names}); choose one with --fleet NAME")
    return candidates[0]


class SupervisorClient:
    def __init__(self, state_dir: str | Path, timeout: float = 3.0):
        self.paths = StatePaths(Path(state_dir))
        self._http = UnixHTTP(str(self.paths.socket), timeout)

    @property
    def state_dir(self) -> Path:
        return self.paths.root

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SupervisorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, path: str, timeout: float | None = None, **params) -> Answer:
        if not self.paths.socket.exists():
            raise SupervisorUnavailable(f"no supervisor socket at {self.paths.socket}")
        try:
            response = self._http.request(method, path, params=params or None, timeout=timeout)
        except TimeoutError as exc:
            raise SupervisorUnavailable(f"the supervisor at {self.paths.socket} timed out") from exc
        except (OSError, http.client.HTTPException) as exc:  # refused, gone, cut off, not HTTP
            raise SupervisorUnavailable(
                f"the supervisor at {self.paths.socket} does not answer: {exc or type(exc).__name__}"
            ) from exc
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            if isinstance(message, dict):  # a proxied server's OpenAI-style {"error": {"message", ...}}
                message = message.get("message") or str(message)
            raise SupervisorError(str(message), response.status_code)
        return response

    def _json(self, method: str, path: str, **params) -> dict:
        return self._request(method, path, **params).json()

    def alive(self) -> bool:
        try:
            self.fleet()
            return True
        except SupervisorUnavailable:
            return False

    # GET
    def fleet(self) -> dict:
        return self._json("GET", "/fleet")

    def server(self, name: str) -> dict:
        return self._json("GET", f"/servers/{name}")

    def history(self, name: str, seconds: float = 300) -> dict:
        return self._json("GET", f"/servers/{name}/history", seconds=seconds)

    def raw_metrics(self, name: str) -> str:
        return self._request("GET", f"/servers/{name}/raw_metrics").text

    def info(self, name: str) -> dict:
        return self._json("GET", f"/servers/{name}/info")

    def expert_placement(self, name: str) -> dict:
        return self._json("GET", f"/servers/{name}/expert_placement")

    def logs(self, name: str, lines: int = 500) -> dict:
        return self._json("GET", f"/servers/{name}/logs", lines=lines)

    def events(self, seconds: float = 300, server: str | None = None) -> dict:
        params = {"seconds": seconds} | ({"server": server} if server else {})
        return self._json("GET", "/events", **params)

    def probe(self) -> dict:
        return self._request("GET", "/probe", timeout=30.0).json()

    # POST
    def server_action(self, name: str, action: str) -> dict:
        """One of `SERVER_ROUTES` on server `name` (KeyError: not an action the supervisor has)."""
        path = f"/servers/{name}/{SERVER_ROUTES[action]}"
        return self._request("POST", path, timeout=_ACTION_TIMEOUT_S.get(action)).json()

    def restart(self, name: str) -> dict:
        return self.server_action(name, "restart")

    def stop(self, name: str) -> dict:
        return self.server_action(name, "stop")

    def start(self, name: str) -> dict:
        return self.server_action(name, "start")

    def rebalance_experts(self, name: str) -> dict:
        return self.server_action(name, "rebalance_experts")

    def reload(self, dry_run: bool = False) -> dict:
        """Re-read the profile: the change per server; applied unless `dry_run` (SupervisorError: refused)."""
        return self._request("POST", "/fleet/reload", timeout=60.0, dry_run=int(dry_run)).json()

    def rolling_restart(self) -> dict:
        return self._json("POST", "/fleet/rolling_restart")

    def shutdown(self) -> dict:
        return self._json("POST", "/shutdown")
