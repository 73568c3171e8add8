"""The supervisor of one fleet: units, health checks, metrics scraping and the state file, on one loop.

Everything runs on one asyncio loop: a 10 Hz tick drives each unit's state machine; health checks
and scrapes are tasks whose results come back to the same loop, so no state is shared across threads.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from console.gpu_owners import FleetProcesses, recorded_fleet
from console.launchers.factory import make_launcher
from console.launchers.local import find_process, signal_group
from console.monitoring.fleet_monitor import FleetMonitor
from console.profile.fleet import ResolvedFleet
from console.profile.schema import ServerSpec
from console.supervisor import statefile, views
from console.supervisor.history import MetricsHistory, ServerStatus
from console.supervisor.load import LoadGenerator
from console.supervisor.logfile import rotate_if_needed, tail
from console.supervisor.paths import StatePaths
from console.supervisor.planning import FleetPlans, PlannedLauncher
from console.supervisor.reload import UNCHANGED, ReloadRefused, apply_change, diff_fleets
from console.supervisor.resources import ProcessSampler
from console.supervisor.scrapes import ServerScrapes
from console.supervisor.states import State
from console.supervisor.unit import ServerUnit

log = logging.getLogger("tokenspeed.supervisor")

TICK_S = 0.1


class UnknownServer(KeyError):
    pass


class Supervisor:
    def __init__(self, resolved: ResolvedFleet, paths: StatePaths, platform: Any = None):
        """`platform`: what `resolved` was resolved against (the probe's GPUs; None: this machine)."""
        self.resolved = resolved
        self.fleet = resolved.profile.fleet
        self.paths = paths
        # Each server starts with its plan's flags; a restart is re-planned (console/supervisor/planning.py).
        self.plans = FleetPlans(resolved, paths.root, recorded_fleet(paths.root), platform)
        inner = make_launcher(
            self.fleet.launcher,
            self.fleet.command,
            paths.root,
            self.fleet.ray_address,
            self.fleet.log_max_bytes,
            self.fleet.log_backups,
        )
        self.launcher = PlannedLauncher(inner, self.plans, self.own_processes)
        self.units: dict[str, ServerUnit] = {}
        self.scraped: dict[str, ServerScrapes] = {}
        # model -> whether it has experts (None: its config is not here), read once (views.moe_of)
        self.moe_by_model: dict[str, bool | None] = {}
        # Servers started with an api_key want it on every route but /health (metrics, info, admin).
        self.auth: dict[str, dict[str, str]] = {}
        self.history = MetricsHistory(paths.history, self.fleet.history_seconds)
        for spec, args in zip(resolved.servers, resolved.server_args, strict=True):
            self.add_unit(spec, args)
        self.retiring: set[str] = set()  # removed from the profile by a reload: gone once stopped
        self.started_at = time.time()
        self.shutting_down = False
        self.http = httpx.AsyncClient(trust_env=False)
        self._tasks: set[asyncio.Task] = set()
        self.resources = ProcessSampler()  # CPU, memory and GPU memory of every server process
        self._rolling: asyncio.Task | None = None
        # The profile's [load] generator, when it has one (set by the daemon, which runs it).
        self.load: LoadGenerator | None = None
        # Prometheus: file_sd targets rewritten on every saved change, and the supervisor's own metrics.
        # Its server_state is the state `tokenspeed status` shows (STALLED included).
        self.monitor = FleetMonitor(
            resolved, paths.root, self.units, lambda unit: views.display_state(self, unit, time.time())
        )

    # ------------------------------------------------------------ lifecycle

    def add_unit(self, spec: ServerSpec, args) -> ServerUnit:
        unit = ServerUnit(
            spec, self.fleet, self.launcher, self.paths.log(spec.name), self.resolved.profile.supervisor
        )
        name = spec.name
        unit.on_event = self.event
        self.units[name] = unit
        self.scraped[name] = ServerScrapes(self.fleet.metrics_interval_s)
        self.auth[name] = self.auth_for(args)
        return unit

    def event(self, server: str, kind: str, text: str) -> None:
        """Record what happened to a server (the events pane; kept in the history for replay)."""
        self.history.add_event(server, time.time(), kind, text)

    @staticmethod
    def auth_for(args) -> dict[str, str]:
        return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    def retire(self, name: str) -> None:
        """Stop a server the profile no longer has (draining first); it leaves the fleet once stopped."""
        self.retiring.add(name)
        self.units[name].stop(time.time())

    def _drop_retired(self) -> None:
        for name in [n for n in self.retiring if not self.units[n].state.has_process]:
            self.retiring.discard(name)
            for table in (self.units, self.scraped, self.auth):
                table.pop(name, None)
            self.monitor.args.pop(name, None)
            self.save()

    def own_processes(self) -> FleetProcesses:
        """The root pids of the servers running now (their GPU memory is this fleet's own)."""
        servers = {name: tuple(h.pid for h in u.handles if h.pid) for name, u in self.units.items()}
        return FleetProcesses(self.fleet.name, {name: pids for name, pids in servers.items() if pids})

    def gpu_view(self) -> dict:
        return self.plans.view(self.own_processes()).to_dict()

    def unit(self, name: str) -> ServerUnit:
        if name not in self.units:
            raise UnknownServer(name)
        return self.units[name]

    def adopt_or_start(self) -> None:
        now = time.time()
        previous = statefile.load(self.paths.state_file) or {}
        # After a clean shutdown there is nothing to re-adopt: `up` means every server starts.
        records = {} if previous.get("clean_exit") else {r["name"]: r for r in previous.get("servers", [])}
        if not previous.get("clean_exit"):
            # Restart counts by reason go on from the previous supervisor's, as each server's `restarts` do.
            self.monitor.metrics.restore_restarts(previous.get("restart_counts"))
        for name, record in records.items():
            if name not in self.units:
                self._kill_leftover(record)
        for name, unit in self.units.items():
            record = records.get(name)
            if record and unit.adopt(record, now):
                log.info("re-adopted %s", name)
                continue
            if record is None or record.get("want_running", True):
                unit.start(now)
        self.save()

    def _kill_leftover(self, record: dict) -> None:
        """A server the profile no longer has, but a previous supervisor left running: stop it."""
        for process in record.get("processes", []):
            if "create_time" in process and find_process(int(process["pid"]), float(process["create_time"])):
                signal_group(int(process["pid"]), signal.SIGKILL)

    def shutdown(self) -> None:
        if not self.shutting_down:
            log.info("shutting down the fleet")
        self.shutting_down = True
        if self._rolling:
            self._rolling.cancel()
        now = time.time()
        for unit in self.units.values():
            unit.stop(now)

    def done(self) -> bool:
        return self.shutting_down and not any(u.state.has_process for u in self.units.values())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown)
        self.adopt_or_start()
        scraper = asyncio.create_task(self._scrape_loop())
        next_housekeeping = 0.0
        try:
            while not self.done():
                now = time.time()
                self.launcher.tend_log_pumps()
                for unit in self.units.values():
                    unit.tick(now)
                    if unit.health_due(now):
                        unit.health_in_flight = True
                        self._spawn(self._check(unit))
                if self.resources.due(now):
                    roots = {n: [h.pid for h in u.handles if h.pid] for n, u in self.units.items()}
                    self.resources.sample(roots)
                    if self.resources.gpu_due(now) and any(s.gpus for s in self.resolved.servers):
                        self._spawn(asyncio.to_thread(self.resources.read_gpus))
                if now >= next_housekeeping:
                    next_housekeeping = now + 1.0
                    self.launcher.poll_logs()
                    for unit in self.units.values():
                        rotate_if_needed(unit.log_path, self.fleet.log_max_bytes, self.fleet.log_backups)
                if self.retiring:
                    self._drop_retired()
                if any(u.changed for u in self.units.values()):
                    self.save()
                await asyncio.sleep(TICK_S)
        finally:
            scraper.cancel()
            self.save(clean_exit=self.done())
            await self.http.aclose()
            self.history.close()
            self.launcher.close()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def save(self, clean_exit: bool = False) -> None:
        for unit in self.units.values():
            unit.changed = False
        statefile.save(
            self.paths.state_file,
            {
                "fleet": self.fleet.name,
                "profile_path": str(self.resolved.profile.path),
                "started_at": self.started_at,
                "clean_exit": clean_exit,
                # Its servers want an API key: `tokenspeed prometheus` then needs --api-key-file.
                "keyed": bool(self.monitor.keys),
                "restart_counts": self.monitor.metrics.saved_restarts(),
                "servers": [u.to_record() for u in self.units.values()],
            },
        )
        self.monitor.on_change()

    # ------------------------------------------------------------ health and metrics

    async def _check(self, unit: ServerUnit) -> None:
        ok = False
        began = time.monotonic()
        try:
            # The key too: a health path other than /health (say /health_generate) is behind it.
            response = await self.http.get(
                unit.spec.url + self.fleet.health.path,
                timeout=self.fleet.health.timeout_s,
                headers=self.auth[unit.spec.name],
            )
            ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        finally:
            self.monitor.observe_health(unit.spec.name, time.monotonic() - began, ok)
            unit.health_result(ok, time.time())

    async def _scrape_loop(self) -> None:
        while True:
            started = time.monotonic()
            # Draining servers too: their requests in flight going down is what a stop waits for.
            live = [
                u for u in self.units.values() if u.state in (State.READY, State.UNHEALTHY, State.STOPPING)
            ]
            scraped = await asyncio.gather(*(self._scrape(u) for u in live), return_exceptions=True)
            # Every server gets a status row each round, so a crash loop without metrics is replayable.
            done = {u.spec.name for u, ok in zip(live, scraped, strict=True) if ok is True}
            now = time.time()
            for unit in live:
                self._note_stall(unit, now, unit.spec.name in done)
            for unit in self.units.values():
                if unit.spec.name not in done:
                    self.history.add_status(unit.spec.name, now, self._status(unit))
            # The next scrape is scheduled only after this one finished: scrapes never pile up.
            await asyncio.sleep(max(self.fleet.metrics_interval_s - (time.monotonic() - started), 0.05))

    def _status(self, unit: ServerUnit) -> ServerStatus:
        running = unit.state.has_process and unit.started_at is not None
        return ServerStatus(
            state=views.display_state(self, unit, time.time()),
            restarts=unit.restarts,
            pid=unit.handles[0].pid if unit.handles else None,
            started_at=unit.started_at if running else None,
        )

    async def _scrape(self, unit: ServerUnit) -> bool:
        """One scrape; True when it recorded a sample (with the server's status) in the history."""
        name = unit.spec.name
        try:
            response = await self.http.get(
                unit.spec.url + "/metrics",
                timeout=min(self.fleet.metrics_interval_s, 2.0),
                headers=self.auth[name],
            )
            response.raise_for_status()
        except httpx.HTTPError:
            return False
        now = time.time()
        scraped = self.scraped[name]
        rebalances = scraped.rebalances
        try:
            summary = scraped.add(response.text, now)
        except ValueError:
            return False
        self.history.add(name, now, summary, self._status(unit))
        after = scraped.rebalances
        if rebalances is not None and after is not None and after > rebalances:
            unit.note(f"experts rebalanced (rebalance #{after:.0f})", "rebalance")
        return True

    def _note_stall(self, unit: ServerUnit, now: float, answered: bool) -> None:
        """A stall beginning or ending, noted each round whether or not the scrape answered, as the
        state (views.stalled_for) reads it: the event must not wait for a scrape that never comes. Only
        an answered scrape counts towards a restart for the stall: a front end that does not answer
        at all fails its health checks, and is restarted for that (reason `unhealthy`)."""
        scraped = self.scraped[unit.spec.name]
        stalled = views.stalled_for(self, unit, now)
        if answered:
            unit.stall_result(stalled, now)  # a stall lasting unhealthy_restart_after_s restarts the server
        if (stalled is not None) != scraped.stall_noted:
            scraped.stall_noted = stalled is not None
            if stalled is not None:
                in_flight = (scraped.summary or {}).get("in_flight") or 0
                unit.note(f"STALLED: no scheduler step or heartbeat for {stalled:.0f}s, {in_flight:.0f} request(s) "
                          "in flight", "stall")  # fmt: skip
            else:
                unit.note("the scheduler steps again", "stall")

    # ------------------------------------------------------------ what the API shows

    def server_json(self, unit: ServerUnit, now: float) -> dict:
        return views.server_json(self, unit, now)

    def fleet_json(self) -> dict:
        return views.fleet_json(self)

    def logs(self, name: str, lines: int) -> list[str]:
        return tail(self.unit(name).log_path, lines)

    def history_since(self, name: str, seconds: float) -> list[dict]:
        self.unit(name)
        return self.history.query(name, time.time() - seconds)

    # ------------------------------------------------------------ operator commands

    def command(self, name: str, action: str) -> dict:
        unit = self.unit(name)
        if self.shutting_down:
            raise RuntimeError("the fleet is shutting down")
        getattr(unit, action)(time.time())
        return {"ok": True, "name": name, "state": unit.state.value}

    def rolling_restart(
        self, ready_timeout_s: float | None = None, units: list[ServerUnit] | None = None
    ) -> dict:
        if self.rolling_in_progress():
            return {"ok": False, "error": "a rolling restart is already running"}
        units = list(self.units.values()) if units is None else units
        self._rolling = asyncio.get_running_loop().create_task(
            self._roll(units, ready_timeout_s or self.fleet.startup_timeout_s)
        )
        return {"ok": True, "servers": [u.spec.name for u in units]}

    def reload(self, new: ResolvedFleet, dry_run: bool = False) -> dict:
        """Apply the profile as re-read (`new`): the change per server, and a rolling restart of only the
        changed ones. ReloadRefused (the fleet untouched) when it cannot be applied now."""
        if self.shutting_down:
            raise ReloadRefused("the fleet is shutting down")
        change = diff_fleets(self.resolved, new)
        answer = {"ok": True, "dry_run": dry_run, "profile_path": str(new.profile.path), **change.to_json()}
        if dry_run or change.empty:
            return answer
        if self.rolling_in_progress():
            raise ReloadRefused("a rolling restart is already running; reload again once it is done")
        log.info("reload: %s", change.message())
        for server in change.servers:
            if server.change != UNCHANGED and server.name in self.units:
                self.units[server.name].note(f"profile reloaded: {server.describe()}")
        changed = apply_change(self, new, change)
        if changed:
            self.rolling_restart(units=changed)
        self.save()
        return answer

    async def _roll(self, units: list[ServerUnit], ready_timeout_s: float) -> None:
        """Restart servers one at a time, each drained and back READY before the next goes down."""
        for unit in units:
            if unit.spec.name in self.retiring or unit.spec.name not in self.units:
                continue
            unit.restart(time.time())
            await asyncio.sleep(TICK_S * 3)
            deadline = time.monotonic() + ready_timeout_s
            while unit.state not in (State.READY, State.FATAL) and time.monotonic() < deadline:
                await asyncio.sleep(TICK_S)
            if unit.state != State.READY:
                log.warning("rolling restart stopped: %s is %s", unit.spec.name, unit.state.value)
                return

    async def proxy(self, name: str, method: str, path: str, timeout: float = 10.0) -> httpx.Response:
        unit = self.unit(name)
        return await self.http.request(method, unit.spec.url + path, timeout=timeout, headers=self.auth[name])

    def rolling_in_progress(self) -> bool:
        return self._rolling is not None and not self._rolling.done()


def remove_socket(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
