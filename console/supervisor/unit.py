"""One supervised server: its processes, its state machine (see states.py) and its restart policy.

`tick(now)` is the only place state changes on its own (exits, timers); operator commands
(`start`, `stop`, `restart`) and health results arrive through the other methods. All of them run on
the supervisor's event loop, so a unit never needs a lock.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

from console.launchers.base import Launcher, ProcessHandle
from console.profile_schema import FleetSpec, ServerSpec
from console.supervisor.logfile import append_line
from console.supervisor.policy import RestartPolicy
from console.supervisor.states import ExitInfo, State


@dataclass
class Timers:
    next_start_at: float | None = None
    stop_deadline: float | None = None
    killed: bool = False
    next_health_at: float = 0.0


class ServerUnit:
    def __init__(self, spec: ServerSpec, fleet: FleetSpec, launcher: Launcher, log_path: Path):
        self.spec = spec
        self.fleet = fleet
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
        self.error: str | None = None
        self.health_failures = 0
        self.health_in_flight = False
        self.changed = True  # something worth saving to the state file

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
                self._note(f"did not stop within {self.fleet.stop_timeout_s:g}s: SIGKILL")
                for handle in self.handles:
                    handle.signal_group(signal.SIGKILL)
                self.timers.killed = True
        elif self.state == State.BACKOFF and self.timers.next_start_at and now >= self.timers.next_start_at:
            self._spawn(now)
        elif (
            self.state == State.STARTING and now - (self.starting_since or now) > self.fleet.startup_timeout_s
        ):
            self.error = f"not healthy within startup_timeout_s={self.fleet.startup_timeout_s:g}"
            self._note(self.error + ": SIGKILL")
            for handle in self.handles:
                handle.signal_group(signal.SIGKILL)
            self.starting_since = now  # one kill; the exit that follows goes through the restart policy
        elif self.state == State.READY and self.ready_since is not None:
            self.policy.note_healthy_since(self.ready_since, now)

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
            self._note(f"{self.health_failures} failed health checks: UNHEALTHY")
            self._set(State.UNHEALTHY)

    # ------------------------------------------------------------ internals

    def _set(self, state: State) -> None:
        if state != self.state:
            self.state = state
            self.changed = True

    def _note(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        append_line(self.log_path, f"[supervisor {stamp}] {self.spec.name}: {message}")

    def _spawn(self, now: float) -> None:
        self.handles = []
        try:
            for process in self.spec.processes:
                self.handles.append(self.launcher.start(self.spec, process, self.log_path))
        except Exception as exc:  # a start that fails (bad command, node gone) is a failed start
            self.error = f"start failed: {exc}"
            self._note(self.error)
            for handle in self.handles:
                handle.signal_group(signal.SIGKILL)
            self.handles = []
            self._after_failure(now, ExitInfo(None, None, now))
            return
        self.started_at = self.starting_since = now
        self.ready_since = None
        self.health_failures = 0
        self.timers = Timers(next_health_at=now + 0.2)
        pids = ", ".join(str(h.pid) for h in self.handles)
        self._note(f"started (pid {pids})")
        self._set(State.STARTING)
        self.changed = True

    def _terminate(self, now: float) -> None:
        self._note("stopping: SIGTERM")
        for handle in self.handles:
            handle.signal_group(signal.SIGTERM)
        self.timers.stop_deadline = now + self.fleet.stop_timeout_s
        self.timers.killed = False
        self._set(State.STOPPING)

    def _on_exit(self, now: float, ended: list[tuple[ProcessHandle, ExitInfo]]) -> None:
        first = ended[0][1]
        gone = {id(h) for h, _ in ended}
        if self.state == State.STOPPING:
            self.handles = [h for h in self.handles if id(h) not in gone]
            self.last_exit = first
            if self.handles:
                return  # wait for the other ranks of the server
            self._note(f"stopped ({_describe(first)})")
            self.changed = True
            self._set(State.STOPPED)
            if self.start_after_stop:
                self.start_after_stop = False
                self.policy.reset()
                self._spawn(now)
            return
        # An exit nobody asked for: the whole server goes down with its first process.
        for handle in self.handles:
            if id(handle) not in gone:
                handle.signal_group(signal.SIGKILL)
        self.handles = []
        self.last_exit = first
        self._note(f"exited unexpectedly ({_describe(first)})")
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
                f"last exit {_describe(exit_info)}"
            )
            self._note(f"FATAL: {self.error}")
            self._set(State.FATAL)
            return
        delay = self.policy.next_delay(now)
        self.restarts += 1
        self.timers = Timers(next_start_at=now + delay)
        self._note(f"restarting in {delay:g}s (restart {self.restarts})")
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
                return False
            handles.append(handle)
        self.handles = handles
        self.started_at = record.get("started_at") or now
        self.starting_since = now
        self.ready_since = record.get("ready_since")
        self.timers = Timers(next_health_at=now)
        self._note(f"re-adopted by a new supervisor (pid {', '.join(str(h.pid) for h in handles)})")
        # Health decides between READY and not; until then the server counts as starting.
        self._set(State.STARTING)
        return True


def _describe(exit_info: ExitInfo) -> str:
    if exit_info.signal:
        return f"signal {exit_info.signal}"
    if exit_info.code is None:
        return "exit status unknown"
    return f"exit code {exit_info.code}"
