"""What the supervisor does for Prometheus: keep the file_sd targets current and serve its own metrics.

The supervisor calls `on_change()` after every state change it saves (start, restart, stop, crash) and
`observe_health()` after each health check; `serve()` runs the loopback metrics port on its event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from console.monitoring import targets
from console.monitoring.fleet_metrics import FleetMetrics
from console.monitoring.metrics_http import address_of, bind_loopback, serve_metrics

log = logging.getLogger("tokenspeed.supervisor")


class FleetMonitor:
    def __init__(self, resolved: Any, state_dir, units: dict[str, Any], state_of: Callable[[Any], str] | None = None):
        self.fleet = resolved.profile.fleet.name
        self.units = units
        self.args = {
            spec.name: args for spec, args in zip(resolved.servers, resolved.server_args, strict=True)
        }
        self.files = targets.TargetFiles(state_dir)
        self.metrics = FleetMetrics(units, state_of)
        self.keys = frozenset(k for a in resolved.server_args if (k := getattr(a, "api_key", None)))
        self.address: str | None = None
        self._written: dict[str, str] = {}

    def on_change(self) -> None:
        self.metrics.observe()
        # A server a profile reload adds may show up here before its arguments do: no model label yet.
        rows = [(u.spec, self.args.get(name), u.state.value) for name, u in self.units.items()]
        self._write(self.files.servers, targets.server_targets(self.fleet, rows))

    def observe_health(self, name: str, seconds: float, ok: bool) -> None:
        self.metrics.observe_health(name, seconds, ok)

    def _write(self, path, groups: list[dict]) -> None:
        text = targets.render(groups)
        if self._written.get(str(path)) == text:
            return  # unchanged: no rename, so Prometheus has nothing to re-read
        try:
            targets.write_atomically(path, text)
        except OSError as exc:  # a full disk must not take the fleet down with it
            log.warning("cannot write %s: %s", path, exc)
            return
        self._written[str(path)] = text

    async def serve(self) -> None:
        from prometheus_client import disable_created_metrics

        # `*_created` samples double the page and no dashboard reads them (the servers drop them too).
        disable_created_metrics()
        sock = bind_loopback()
        self.address = address_of(sock)
        self._write(self.files.supervisor, targets.supervisor_targets(self.fleet, self.address))
        log.info("supervisor metrics on http://%s/metrics", self.address)
        try:
            await serve_metrics(self.metrics.render, self.keys, sock)
        finally:
            self._write(self.files.supervisor, [])
            sock.close()
