"""What `tokenspeed up / down / status / ps / logs / restart` do (console/cli.py holds only the flags).

Each function returns the process exit code documented in console/cli.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import click

from console.client import SupervisorClient, SupervisorError, SupervisorUnavailable, find_state_dir
from console.supervisor import statefile
from console.supervisor.daemon import spawn as spawn_daemon
from console.supervisor.load_report import LoadReport
from console.supervisor.logfile import tail
from console.supervisor.paths import StatePaths, default_state_dir

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_FLEET = 0, 1, 2, 3


def _err(message: str) -> None:
    click.echo(message, err=True)


def _client(fleet: str | None, state_dir: str | None) -> SupervisorClient:
    return SupervisorClient(find_state_dir(fleet, state_dir))


# ------------------------------------------------------------------ up


def _summary(servers: list[dict]) -> str:
    return "  ".join(f"{s['name']}={s['state']}" for s in servers)


def down_command(name: str, state_dir: Path, explicit: bool) -> str:
    """The `tokenspeed down` that stops this fleet and no other: by --state-dir when one was given (a
    fleet kept elsewhere is not found by name), else by --fleet (several fleets may run)."""
    import shlex

    return (
        f"tokenspeed down --state-dir {shlex.quote(str(state_dir))}"
        if explicit
        else f"tokenspeed down --fleet {name}"
    )


# Signals that stop a foreground `up`, and its fleet, as Ctrl-C does.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupted(signum: int, frame) -> None:
    raise KeyboardInterrupt


def up(profile: str, detach: bool, state_dir: str | None, timeout: float) -> int:
    from console.gpu_owners import recorded_fleet
    from console.profile.cli import problems_text
    from console.profile.plan import check_fits
    from console.profile.preflight import preflight

    # Every problem at once (profile keys, models, ports, state directory), before anything starts.
    report = preflight(profile, state_dir)
    if not report.ok:
        _err(problems_text(report.problems))
        return EXIT_USAGE
    resolved = report.resolved
    fleet = resolved.profile.fleet
    paths = StatePaths(Path(state_dir).resolve() if state_dir else default_state_dir(fleet.name))
    stop_it = down_command(fleet.name, paths.root, state_dir is not None)
    client = SupervisorClient(paths.root)
    daemon = None
    if client.alive():
        click.echo(f"fleet {fleet.name} is already supervised from {paths.root}")
    else:
        # Servers a killed supervisor left running are re-adopted: their memory is the fleet's own.
        refusal = check_fits(resolved, own=recorded_fleet(paths.root))
        if refusal:
            client.close()
            _err(f"error: the plan does not fit: {refusal}\nnothing was started")
            return EXIT_USAGE
        daemon = spawn_daemon(resolved.profile.path, paths)
        click.echo(f"fleet {fleet.name}: supervisor pid {daemon.pid}, state in {paths.root}")
    if not detach and threading.current_thread() is threading.main_thread():
        # "Ctrl-C stops the fleet" holds even when the parent ignored SIGINT (a script's `trap '' INT`, a
        # background job of a non-interactive shell): an ignored signal is inherited across exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # A service manager's stop (SIGTERM) and a closed terminal (SIGHUP) end a foreground `up` the way
        # Ctrl-C does: the fleet stops with it rather than running on with nobody watching it.
        for sig in _STOP_SIGNALS:
            signal.signal(sig, _interrupted)
    deadline = time.monotonic() + timeout
    last = ""
    ready = False
    try:
        while True:
            if daemon is not None and daemon.poll() is not None:
                _err(f"error: the supervisor exited with code {daemon.returncode}:")
                _err("\n".join(tail(paths.supervisor_log, 5)))
                return EXIT_USAGE if daemon.returncode == EXIT_USAGE else EXIT_FAILED
            try:
                servers = client.fleet()["servers"]
            except SupervisorUnavailable:
                servers = None
            if servers is not None:
                line = _summary(servers)
                if line != last:
                    click.echo(time.strftime("%H:%M:%S ") + line)
                    last = line
                fatal = [s for s in servers if s["state"] == "FATAL"]
                if fatal and not ready:
                    for s in fatal:
                        _err(f"error: {s['name']} is FATAL: {s['error']}")
                        _err("\n".join("  " + ln for ln in tail(paths.log(s["name"]), 10)))
                    _err(f"the fleet stays up for inspection; `{stop_it}` stops it")
                    return EXIT_FAILED
                if not ready and servers and all(s["state"] in ("STOPPED", "FATAL") for s in servers):
                    _err("error: no server is running: " + line)
                    return EXIT_FAILED
                if not ready and servers and all(s["state"] == "READY" for s in servers):
                    ready = True
                    click.echo(f"fleet {fleet.name} READY: " + ", ".join(s["url"] for s in servers))
                    if detach:
                        click.echo(f"`{stop_it}` stops it")
                        return EXIT_OK
                    click.echo("Ctrl-C stops the fleet")
            elif ready:
                _err("the supervisor went away")
                return EXIT_FAILED
            if not ready and time.monotonic() > deadline:
                _err(f"error: not READY within {timeout:g}s: {last}")
                return EXIT_FAILED
            time.sleep(0.3)
    except KeyboardInterrupt:
        click.echo("\nstopping the fleet")
        for sig in _STOP_SIGNALS:  # a second SIGTERM must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        return down(None, str(paths.root), timeout=60.0)
    finally:
        client.close()


# ------------------------------------------------------------------ down


def _recorded_processes(paths: StatePaths) -> list[dict]:
    state = statefile.load(paths.state_file) or {}
    return [p for s in state.get("servers", []) for p in s.get("processes", [])]


def _alive(process: dict) -> bool:
    from console.launchers.local import find_process

    return (
        "create_time" in process
        and find_process(int(process["pid"]), float(process["create_time"])) is not None
    )


def _supervisor_pid(paths: StatePaths) -> dict | None:
    try:
        record = json.loads(paths.pid_file.read_text())
    except (OSError, ValueError):
        return None
    return record if _alive(record) else None


def _no_fleet_or_usage(exc: SupervisorError) -> int:
    """The documented code (console/cli.py) of a fleet that could not be reached: 3 when none answers, 2
    when the command must say which (several fleets run) or the supervisor refused what it asked."""
    _err(f"error: {exc}")
    return EXIT_NO_FLEET if isinstance(exc, SupervisorUnavailable) else EXIT_USAGE


def down(fleet: str | None, state_dir: str | None, timeout: float) -> int:
    try:
        paths = StatePaths(find_state_dir(fleet, state_dir))
    except SupervisorError as exc:
        return _no_fleet_or_usage(exc)
    supervisor = _supervisor_pid(paths)
    with SupervisorClient(paths.root) as client:
        try:
            client.shutdown()
            asked = True
        except SupervisorUnavailable:
            asked = False
    deadline = time.monotonic() + timeout
    if asked:
        while time.monotonic() < deadline and (_supervisor_pid(paths) or paths.socket.exists()):
            time.sleep(0.2)
    leftovers = [p for p in _recorded_processes(paths) if _alive(p)]
    if not asked and supervisor is None and not leftovers:
        _err(f"error: no running fleet in {paths.root}")
        return EXIT_NO_FLEET
    if leftovers or (supervisor and _alive(supervisor)):
        # The supervisor is gone or stuck: stop what it left, the same way it would have.
        from console.launchers.local import signal_group

        for p in leftovers:
            signal_group(int(p["pid"]), signal.SIGKILL)
        if supervisor and _alive(supervisor):
            os.kill(int(supervisor["pid"]), signal.SIGKILL)
        time.sleep(0.3)
        leftovers = [p for p in _recorded_processes(paths) if _alive(p)]
        if paths.socket.exists():
            paths.socket.unlink()
    if leftovers:
        _err("error: processes still running: " + ", ".join(str(p["pid"]) for p in leftovers))
        return EXIT_FAILED
    click.echo(f"fleet in {paths.root} stopped")
    return EXIT_OK


# ------------------------------------------------------------------ status, ps, logs, restart


def _exit_text(last_exit: dict | None) -> str:
    if not last_exit:
        return "-"
    if last_exit.get("signal"):
        how = f"signal {last_exit['signal']}"
    else:
        how = "unknown" if last_exit.get("code") is None else f"code {last_exit['code']}"
    reason = last_exit.get("reason")
    if reason and how == "unknown":
        return reason
    return f"{how} ({reason})" if reason else how


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def status(fleet: str | None, state_dir: str | None, as_json: bool) -> int:
    try:
        with _client(fleet, state_dir) as client:
            data = client.fleet()
    except SupervisorError as exc:
        return _no_fleet_or_usage(exc)
    servers = data["servers"]
    load = LoadReport.from_json(data.get("load"))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "fleet": data["name"],
                    "state_dir": data["state_dir"],
                    "servers": servers,
                    "load": load.to_json() if load is not None else None,
                },
                indent=1,
            )
        )
    else:
        header = ("NAME", "STATE", "PID", "NODE", "PORT", "RESTARTS", "UPTIME", "LAST EXIT", "URL")
        rows = [header] + [
            (
                s["name"],
                s["state"],
                str(s["pid"] or "-"),
                s["node"],
                str(s["port"]),
                str(s["restarts"]),
                _uptime(s["uptime_s"]),
                _exit_text(s["last_exit"]),
                s["url"],
            )
            for s in servers
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        click.echo(f"fleet {data['name']} ({data['state_dir']})")
        for row in rows:
            click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip())
        for s in servers:
            if s["error"]:
                click.echo(f"{s['name']}: {s['error']}")
        if load is not None:
            click.echo(load.describe())
    return EXIT_OK if all(s["state"] == "READY" for s in servers) else EXIT_FAILED


def ps(fleet: str | None, state_dir: str | None) -> int:
    import psutil

    try:
        with _client(fleet, state_dir) as client:
            data = client.fleet()
    except SupervisorError as exc:
        return _no_fleet_or_usage(exc)
    click.echo(f"{'PID':>7}  {'RSS MiB':>8}  {'SERVER':<16} COMMAND")
    rows = [("supervisor", data.get("supervisor_pid"))]
    rows += [(s["name"], pid) for s in data["servers"] for pid in s.get("pids") or []]
    for owner, pid in rows:
        if pid is None:
            continue
        try:
            root = psutil.Process(pid)
            family = [root] + (root.children(recursive=True) if owner != "supervisor" else [])
        except psutil.NoSuchProcess:
            continue
        for proc in family:
            try:
                rss = proc.memory_info().rss / 2**20
                cmd = " ".join(proc.cmdline())[:100]
            except psutil.Error:
                continue
            click.echo(f"{proc.pid:>7}  {rss:>8.0f}  {owner:<16} {cmd}")
    return EXIT_OK


def logs(fleet: str | None, state_dir: str | None, server: str, follow: bool, lines: int) -> int:
    try:
        root = find_state_dir(fleet, state_dir)
    except SupervisorError as exc:
        return _no_fleet_or_usage(exc)
    try:
        with SupervisorClient(root) as client:
            path = client.paths.log(server)
            # Asked even when following: an unknown server is a usage error, not an empty log.
            shown = client.logs(server, 0 if follow else lines)["lines"]
    except SupervisorUnavailable:
        # No supervisor: the logs it left are still there to read.
        path = StatePaths(root).log(server)
        if not path.exists():
            known = sorted(p.name.removesuffix(".log") for p in path.parent.glob("*.log"))
            names = f"; the logs there are of {', '.join(known)}" if known else ""
            _err(f"error: no log for {server} in {path.parent}{names}")
            return EXIT_USAGE if known else EXIT_NO_FLEET
        shown = [] if follow else tail(path, lines)
    except SupervisorError as exc:
        _err(f"error: {exc}")
        return EXIT_USAGE
    if not follow:
        for line in shown:
            click.echo(line)
        return EXIT_OK
    try:
        _follow(path, lines)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _follow(path: Path, lines: int) -> None:
    """The last `lines` lines, then every line appended, across rotations and server restarts.

    The first lines and the followed ones come from the same open file, so nothing falls between them.
    """
    import codecs

    from console.supervisor.logfollow import LogFollower

    follower = LogFollower(path)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        for line in follower.start(lines):
            click.echo(line)
        while True:
            chunk = follower.read()
            if chunk:
                click.echo(decoder.decode(chunk), nl=False)
            else:
                time.sleep(0.25)
    finally:
        follower.close()


def restart(fleet: str | None, state_dir: str | None, server: str | None, rolling: bool) -> int:
    try:
        with _client(fleet, state_dir) as client:
            if server is not None:
                result = client.restart(server)
                click.echo(f"{server}: restarting ({result['state']})")
            elif rolling:
                result = client.rolling_restart()
                if not result.get("ok"):
                    _err(f"error: {result.get('error')}")
                    return EXIT_FAILED
                click.echo("rolling restart of " + ", ".join(result["servers"]))
            else:
                for s in client.fleet()["servers"]:
                    client.restart(s["name"])
                    click.echo(f"{s['name']}: restarting")
    except SupervisorError as exc:
        return _no_fleet_or_usage(exc)
    return EXIT_OK


def reload(fleet: str | None, state_dir: str | None, dry_run: bool, as_json: bool) -> int:
    """Re-read the fleet's profile; print the change per server and what applying it does."""
    try:
        with _client(fleet, state_dir) as client:
            result = client.reload(dry_run=dry_run)
    except SupervisorUnavailable as exc:
        _err(f"error: {exc}")
        return EXIT_NO_FLEET
    except SupervisorError as exc:
        _err(f"error: the profile was not applied:\n{exc}")
        return EXIT_USAGE
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return EXIT_OK
    click.echo(f"profile {result['profile_path']}")
    for server in result["servers"]:
        fields = ", ".join(f"{k} {_value(a)} -> {_value(b)}" for k, (a, b) in server["fields"].items())
        click.echo(f"  {server['name']}: {server['change']}" + (f" ({fields})" if fields else ""))
    for key, (before, after) in result["fleet"].items():
        click.echo(f"  {key}: {_value(before)} -> {_value(after)}")
    message = result["message"]
    click.echo(
        f"dry run, nothing applied: {message}" if dry_run else message.replace("reload will ", "reloading: ")
    )
    return EXIT_OK


def _value(value) -> str:
    return "unset" if value is None else str(value)
