"""How `tokenspeed console` finds its data: attach to a fleet, start one from a profile, or open a replay."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from console.client import SupervisorClient, SupervisorUnavailable, find_state_dir
from console.supervisor.paths import StatePaths, default_state_dir
from console.tui.source import DataSource, SourceError

START_TIMEOUT_S = 30.0


@dataclass
class OpenedSource:
    source: DataSource
    started_fleet: bool
    profile_path: str | None
    state_dir: Path | None = None

    def stop_fleet(self, timeout: float = 120.0) -> bool:
        """Shut the fleet down and wait for its supervisor to go; False if it did not in time."""
        print("tokenspeed console: stopping the fleet ...", file=sys.stderr)
        try:
            self.source.shutdown()
        except SourceError as exc:
            print(f"tokenspeed console: could not stop the fleet: {exc}", file=sys.stderr)
            return False
        if self.state_dir is None:
            return True
        deadline = time.monotonic() + timeout
        with SupervisorClient(self.state_dir, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if not client.alive():
                    print("tokenspeed console: the fleet is stopped", file=sys.stderr)
                    return True
                time.sleep(0.2)
        print(f"tokenspeed console: the fleet did not stop within {timeout:.0f}s", file=sys.stderr)
        return False


def fleet_state_dir(profile: str) -> Path:
    from console.profile.fleet import load_profile

    return default_state_dir(load_profile(profile).fleet.name)


def refuse_problems(profile: str | Path, state_dir: str | Path | None) -> bool:
    """ValueError with every problem the pre-flight finds (as `tokenspeed up` prints them); else whether
    this very fleet already runs from `state_dir`."""
    from console.profile.cli import problems_text
    from console.profile.preflight import preflight

    report = preflight(profile, state_dir)
    if not report.ok:
        raise ValueError(problems_text(report.problems).removeprefix("error: "))
    return report.running


def start_supervisor(
    profile: str | Path, state_dir: str | Path, timeout: float = START_TIMEOUT_S, checked: bool = False
) -> None:
    """Start the fleet's supervisor daemon detached (its own session, so it outlives this console), after
    the pre-flight (`checked`: the caller ran it)."""
    from console.supervisor.daemon import spawn

    if not checked:
        refuse_problems(profile, state_dir)
    paths = StatePaths(Path(state_dir).resolve())
    proc = spawn(profile, paths)
    deadline = time.monotonic() + timeout
    with SupervisorClient(paths.root, timeout=1.0) as client:
        while time.monotonic() < deadline:
            if client.alive():
                return
            code = proc.poll()
            if code is not None and code != 3:  # 3: another supervisor holds the lock; wait for it
                tail = paths.supervisor_log.read_text(errors="replace").splitlines()[-5:]
                raise ValueError(f"the supervisor for {profile} exited with {code}: " + " | ".join(tail))
            time.sleep(0.1)
    raise ValueError(
        f"the supervisor for {profile} did not answer within {timeout:.0f}s (see {paths.supervisor_log})"
    )


def open_source(
    profile: str | None = None,
    fleet: str | None = None,
    state_dir: str | None = None,
    replay: str | None = None,
    at: str | None = None,
) -> OpenedSource:
    if replay is not None:
        from console.tui.replay_source import ReplaySource

        return OpenedSource(ReplaySource(replay, at), started_fleet=False, profile_path=None)
    if at is not None:
        raise ValueError("--at goes with --replay STATE_DIR")
    from console.tui.live_source import LiveSource

    started = False
    if profile is not None:
        # Every problem before anything starts; a fleet of another profile in that directory is one.
        running = refuse_problems(profile, state_dir)
        directory = Path(state_dir) if state_dir else fleet_state_dir(profile)
        if not running:
            start_supervisor(profile, directory, checked=True)
            started = True
    else:
        directory = find_state_dir(fleet, state_dir)
        with SupervisorClient(directory, timeout=2.0) as client:
            if not client.alive():
                raise SupervisorUnavailable(
                    f"no supervisor answers in {directory}; start the fleet with `tokenspeed up`"
                )
    return OpenedSource(
        LiveSource(directory), started_fleet=started, profile_path=profile, state_dir=directory
    )
