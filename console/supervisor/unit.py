"""One supervised server: its processes, its state machine (see states.py) and its restart policy.

`tick(now)` is the only place state changes on its own (exits, timers); operator commands
(`start`, `stop`, `restart`) and health results arrive through the other methods. All of them run on
the supervisor's event loop, so a unit never needs a lock.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from console.launchers.base import Launcher, ProcessHandle
from console.profile.schema import FleetSpec, ProcessSpec, ServerSpec, SupervisorSpec
from console.supervisor.logfile import supervisor_note
from console.supervisor.planning import PlanRefused
from console.supervisor.policy import RestartPolicy
from console.supervisor.states import REASON_STALLED, REASON_UNHEALTHY, REASON_UNSUPERVISED, ExitInfo, State

log = logging.getLogger("tokenspeed.supervisor")

# How long a server drains on SIGTERM (tokenspeed/runtime/entrypoints/http_runner.py reads it).
DRAIN_ENV = "TOKENSPEED_DRAIN_TIMEOUT"


@dataclass
class Timers:
    next_start_at: float | None = None
    stop_deadline: float | None = None
    killed: bool = False
    next_health_at: float = 0.0
    # Why the supervisor is stopping the server on its own (a hung server): its exit is then a failure
    # that goes through the restart policy, with this reason in `last_exit`.
    stop_reason: str | None = None


def _with_drain(process: ProcessSpec, fleet: FleetSpec) -> ProcessSpec:
    """The process with TOKENSPEED_DRAIN_TIMEOUT a little under stop_timeout_s (unless [env] sets it): the
    server then fails what is still running with a clear error and exits before the SIGKILL would land."""
    env = dict(process.env)
    if DRAIN_ENV in env:
        return process
    margin = min(2.0, fleet.stop_timeout_s * 0.2)
    env[DRAIN_ENV] = f"{max(fleet.stop_timeout_s - margin, 0.0):g}"
    return dataclasses.replace(process, env=tuple(sorted(env.items())))


# The kind of an event, from the words the supervisor notes it with (first match wins).
_KINDS = (
    ("profile reloaded", "reload"),
    ("FATAL", "fatal"),
    ("exited", "exit"),
    ("stopped (", "exit"),
    ("not re-adopted", "exit"),
    ("restarting", "restart"),
    ("SIGKILL", "kill"),
    ("stopping", "drain"),
    ("health", "health"),
    ("UNHEALTHY", "health"),
    ("started", "start"),
    ("re-adopted", "start"),
)


def event_kind(message: str) -> str:
    return next((kind for words, kind in _KINDS if words in message), "note")


class ServerUnit:
    def __init__(
        self,
        spec: ServerSpec,
        fleet: FleetSpec,
        launcher: Launcher,
        log_path: Path,
        supervisor: SupervisorSpec | None = None,
    ):
        self.spec = spec
        self.fleet = fleet
        self.supervisor = supervisor or SupervisorSpec()
        self.launcher = launcher
        self.log_path = log_path
        self.policy = RestartPolicy(fleet.restart, fleet.backoff, fleet.max_restarts, fleet.restart_window_s)
        self.state = State.STOPPED
        self.handles: list[ProcessHandle] = []
        self.timers = Timers()
        self.want_running = False
        self.start_after_stop = False
        self.restarts = 0
        self.last_exit: ExitInfo | None = None
        self.started_at: float | None = None
        self.starting_since: float | None = None  # when the current wait for a first healthy answer began
        self.ready_since: float | None = None
        self.unhealthy_since: float | None = None
        # When its scheduler last made progress, while the scrapes say it is stalled (None: it is not).
        self.stalled_since: float | None = None
        self.error: str | None = None
        self.health_failures = 0
        self.health_in_flight = False
        self.changed = True  # something worth saving to the state file
        # A reloaded profile changed this server: its next start (the rolling restart's) uses this spec.
        self.next_spec: ServerSpec | None = None
        self.stopping_since: float | None = None  # when the drain (SIGTERM) began
        # (server, kind, text) -> None: where the supervisor records events (its history database)
        self.on_event: Callable[[str, str, str], None] | None = None

    def configure(self, fleet: FleetSpec, supervisor: SupervisorSpec) -> None:
        """A reloaded profile's supervision settings, for the running server (no restart needed)."""
        self.fleet, self.supervisor = fleet, supervisor
        self.policy.policy, self.policy.backoff = fleet.restart, fleet.backoff
        self.policy.max_restarts, self.policy.window_s = fleet.max_restarts, fleet.restart_window_s

    # ------------------------------------------------------------ commands

    def start(self, now: float) -> None:
        """Start (or keep) the server running; an explicit start forgets a crash loop."""
        self.want_running = True
        if self.state in (State.STOPPED, State.FATAL, State.BACKOFF):
            self.policy.reset()
            self._spawn(now)
        elif self.state == State.STOPPING:
            self.start_after_stop = True

    def stop(self, now: float) -> None:
        self.want_running = False
        self.start_after_stop = False
        if self.state.has_process and self.state != State.STOPPING:
            self._terminate(now)
        elif self.state in (State.BACKOFF, State.FATAL):
            self._set(State.STOPPED)

    def restart(self, now: float) -> None:
        self.want_running = True
        if self.state.has_process:
            if self.state != State.STOPPING:
                self._terminate(now)
            self.start_after_stop = True
        else:
            self.start(now)

    # ------------------------------------------------------------ time passes

    def tick(self, now: float) -> None:
        if self.handles:
            ended = [(h, e) for h in self.handles if (e := h.poll()) is not None]
            if ended:
                self._on_exit(now, ended)
        if self.state == State.STOPPING and self.timers.stop_deadline and now >= self.timers.stop_deadline:
            if not self.timers.killed:
                self.note(f"did not stop within {self.fleet.stop_timeout_s:g}s: SIGKILL")
                for handle in self.handles:
                    handle.signal_group(signal.SIGKILL)
                self.timers.killed = True
        elif self.state == State.BACKOFF and self.timers.next_start_at and now >= self.timers.next_start_at:
            self._spawn(now)
        elif (
            self.state == State.STARTING and now - (self.starting_since or now) > self.fleet.startup_timeout_s
        ):
            self.error = f"not healthy within startup_timeout_s={self.fleet.startup_timeout_s:g}"
            self.note(self.error + ": SIGKILL")
            for handle in self.handles:
                handle.signal_group(signal.SIGKILL)
            self.starting_since = now  # one kill; the exit that follows goes through the restart policy
        elif self.state in (State.READY, State.UNHEALTHY) and (reason := self._hung_reason(now)):
            since = self.stalled_since if reason == REASON_STALLED else self.unhealthy_since
            limit = self.supervisor.unhealthy_restart_after_s
            message = f"{reason.upper()} for {now - since:.0f}s (unhealthy_restart_after_s={limit:g})"
            self.note(f"{message}: restarting, reason {reason}")
            log.warning("%s: %s: restarting", self.spec.name, message)
            self._terminate(now, reason=reason)
        elif self.state == State.READY and self.ready_since is not None and self.stalled_since is None:
            self.policy.note_healthy_since(self.ready_since, now)

    def _hung_reason(self, now: float) -> str | None:
        """A server STALLED or UNHEALTHY past `[supervisor] unhealthy_restart_after_s` (0: never) is healed
        by a restart, unless the restart policy is "no" (then the operator decides); "stalled" when the
        scrapes showed it, as the more precise of the two."""
        limit = self.supervisor.unhealthy_restart_after_s
        if limit <= 0 or self.policy.policy == "no" or not self.want_running:
            return None
        if self.stalled_since is not None and now - self.stalled_since >= limit:
            return REASON_STALLED
        if self.unhealthy_since is not None and now - self.unhealthy_since >= limit:
            return REASON_UNHEALTHY
        return None

    def stall_result(self, stalled_s: float | None, now: float) -> None:
        """What the latest scrape says: quiet for `stalled_s` seconds past the bound, or None (progress)."""
        if stalled_s is None:
            self.stalled_since = None
        elif self.stalled_since is None:
            self.stalled_since = now - stalled_s

    def health_due(self, now: float) -> bool:
        if self.health_in_flight or self.state not in (State.STARTING, State.READY, State.UNHEALTHY):
            return False
        return now >= self.timers.next_health_at

    def health_result(self, ok: bool, now: float) -> None:
        self.health_in_flight = False
        # Poll quickly while starting, so READY is reported as soon as it is true.
        interval = (
            min(self.fleet.health.interval_s, 0.5)
            if self.state == State.STARTING
            else self.fleet.health.interval_s
        )
        self.timers.next_health_at = now + interval
        if not self.state.has_process or self.state == State.STOPPING:
            return
        if ok:
            self.health_failures = 0
            if self.state == State.UNHEALTHY:
                self.note(f"health checks pass again after {now - (self.unhealthy_since or now):.0f}s: READY")
            self.unhealthy_since = None
            if self.state != State.READY:
                if self.state == State.STARTING:
                    self.ready_since = now
                    self.error = None
                self._set(State.READY)
            return
        if self.state == State.STARTING:
            return
        self.health_failures += 1
        if self.health_failures >= self.fleet.health.failures and self.state == State.READY:
            self.note(f"{self.health_failures} failed health checks: UNHEALTHY")
            self.unhealthy_since = now
            self._set(State.UNHEALTHY)

    # ------------------------------------------------------------ internals

    def _set(self, state: State) -> None:
        if state != self.state:
            self.state = state
            self.changed = True

    def note(self, message: str, kind: str | None = None) -> None:
        """A line in the server's log, from the supervisor, and an event (the events pane, replay)."""
        supervisor_note(self.log_path, self.spec.name, message)
        if self.on_event is not None:
            self.on_event(self.spec.name, kind or event_kind(message), message)

    def _spawn(self, now: float) -> None:
        if self.next_spec is not None:
            self.spec, self.next_spec = self.next_spec, None
        self.handles = []
        try:
            for process in self.spec.processes:
                self.handles.append(
                    self.launcher.start(self.spec, _with_drain(process, self.fleet), self.log_path)
                )
        except PlanRefused as exc:  # it cannot fit the GPUs now: starting it again and again would not
            self.error = f"refused: {exc}"
            self.note(f"FATAL: {self.error}")
            for handle in self.handles:
                handle.signal_group(signal.SIGKILL)
            self.handles = []
            self._set(State.FATAL)
            self.changed = True
            return
        except Exception as exc:  # a start that fails (bad command, node gone) is a failed start
            self.error = f"start failed: {exc}"
            self.note(self.error)
            for handle in self.handles:
                handle.signal_group(signal.SIGKILL)
            self.handles = []
            # No process ran, so no exit code: the reason is what `status` and a crash loop's error show.
            self.last_exit = ExitInfo(None, None, now, self.error)
            self.changed = True
            self._after_failure(now, self.last_exit)
            return
        self.started_at = self.starting_since = now
        self.ready_since = self.unhealthy_since = self.stalled_since = None
        self.health_failures = 0
        self.timers = Timers(next_health_at=now + 0.2)
        pids = ", ".join(str(h.pid) for h in self.handles)
        self.note(f"started (pid {pids})")
        self._set(State.STARTING)
        self.changed = True

    def _terminate(self, now: float, reason: str | None = None) -> None:
        # SIGTERM is the server's drain request: new requests get 503 (Retry-After), those in flight have
        # until the deadline (the server's TOKENSPEED_DRAIN_TIMEOUT is set just short of it) to finish.
        self.note(f"stopping: SIGTERM (draining up to stop_timeout_s={self.fleet.stop_timeout_s:g}s)")
        for handle in self.handles:
            handle.signal_group(signal.SIGTERM)
            # A stopped (SIGSTOP) server acts on its SIGTERM only once it runs again.
            handle.signal_group(signal.SIGCONT)
        self.timers.stop_deadline = now + self.fleet.stop_timeout_s
        self.stopping_since = now
        self.timers.killed = False
        self.timers.stop_reason = reason
        self._set(State.STOPPING)

    def _on_exit(self, now: float, ended: list[tuple[ProcessHandle, ExitInfo]]) -> None:
        first = ended[0][1]
        gone = {id(h) for h, _ in ended}
        if self.state == State.STOPPING:
            self.handles = [h for h in self.handles if id(h) not in gone]
            reason = self.timers.stop_reason
            self.last_exit = first if reason is None else dataclasses.replace(first, reason=reason)
            if self.handles:
                return  # wait for the other ranks of the server
            self.note(f"stopped ({self.last_exit.describe()})")
            self.changed = True
            self._set(State.STOPPED)
            if self.start_after_stop:
                self.start_after_stop = False
                self.policy.reset()
                self._spawn(now)
            elif reason is not None:
                self._after_failure(now, self.last_exit)
            return
        # An exit nobody asked for: the whole server goes down with its first process.
        for handle in self.handles:
            if id(handle) not in gone:
                handle.signal_group(signal.SIGKILL)
        self.handles = []
        self.last_exit = first
        self.note(f"exited unexpectedly ({first.describe()})")
        self._after_failure(now, first)

    def _after_failure(self, now: float, exit_info: ExitInfo) -> None:
        self.changed = True
        self.ready_since = None
        if not self.want_running or not self.policy.wants_restart(exit_info):
            self._set(State.STOPPED)
            return
        if self.policy.crash_looping(now):
            self.error = (
                f"crash loop: {self.fleet.max_restarts} restarts within {self.fleet.restart_window_s:g}s; "
                f"last exit: {exit_info.describe()}"
            )
            self.note(f"FATAL: {self.error}")
            self._set(State.FATAL)
            return
        delay = self.policy.next_delay(now)
        self.restarts += 1
        self.timers = Timers(next_start_at=now + delay)
        self.note(f"restarting in {delay:g}s (restart {self.restarts})")
        self._set(State.BACKOFF)

    # ------------------------------------------------------------ persistence

    def to_record(self) -> dict:
        return {
            "name": self.spec.name,
            "state": self.state.value,
            "want_running": self.want_running,
            "restarts": self.restarts,
            "last_exit": self.last_exit.to_dict() if self.last_exit else None,
            "started_at": self.started_at,
            "ready_since": self.ready_since,
            "error": self.error,
            "processes": [h.record() for h in self.handles],
        }

    def adopt(self, record: dict, now: float) -> bool:
        """Take over the processes of a previous supervisor; False when they are gone (start afresh)."""
        self.restarts = int(record.get("restarts", 0))
        self.last_exit = ExitInfo.from_dict(record.get("last_exit"))
        self.want_running = bool(record.get("want_running", True))
        saved = {int(p["node_rank"]): p for p in record.get("processes", [])}
        if not saved or len(saved) != len(self.spec.processes):
            return False
        handles = []
        for process in self.spec.processes:
            handle = self.launcher.adopt(self.spec, process, saved.get(process.node_rank, {}), self.log_path)
            if handle is None:
                for h in handles:
                    h.signal_group(signal.SIGKILL)
                # Its exit code went to the supervisor that died (or to init): say what is known.
                self.last_exit = ExitInfo(None, None, now, REASON_UNSUPERVISED)
                self.changed = True
                self.note(f"not re-adopted: {REASON_UNSUPERVISED}")
                return False
            handles.append(handle)
        self.handles = handles
        self.started_at = record.get("started_at") or now
        self.starting_since = now
        self.ready_since = record.get("ready_since")
        self.timers = Timers(next_health_at=now)
        self.note(f"re-adopted by a new supervisor (pid {', '.join(str(h.pid) for h in handles)})")
        # Health decides between READY and not; until then the server counts as starting.
        self._set(State.STARTING)
        return True
