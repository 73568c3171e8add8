"""The supervisor process: `python -m console.supervisor.daemon --profile P --state-dir D`.

`tokenspeed up` starts it in its own session with stdout/stderr on `supervisor.log`, so it outlives
the terminal and any console. One supervisor per state directory (an flock on `supervisor.lock`).
Exit codes: 0 after a clean shutdown, 2 for a bad profile, 3 when another supervisor holds the lock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import psutil

from console.probe import probe_gpus
from console.profile.fleet import ProfileError, load_and_resolve
from console.profile.plan import platform_facts
from console.supervisor.paths import StatePaths


def spawn(profile: str | Path, paths: StatePaths) -> subprocess.Popen:
    """Start the supervisor of `profile` detached: in its own session (so it outlives the terminal and
    any console), stdin closed, stdout and stderr appended to `supervisor.log` (created 0600). The one
    way `tokenspeed up` and `tokenspeed console` start a fleet."""
    paths.ensure()
    log = os.open(paths.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "console.supervisor.daemon",
                "--profile",
                str(Path(profile).resolve()),
                "--state-dir",
                str(paths.root),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)


def _lock(paths: StatePaths):
    handle = open(paths.lock_file, "a+")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


async def _main(paths: StatePaths, resolved, platform) -> None:
    from console.supervisor.api import bind_socket, serve_api
    from console.supervisor.core import Supervisor, remove_socket
    from console.supervisor.load import for_supervisor

    sup = Supervisor(resolved, paths, platform)
    sock = bind_socket(paths.socket)
    api = asyncio.create_task(serve_api(sup, sock))
    metrics_port = asyncio.create_task(sup.monitor.serve())  # loopback /metrics for Prometheus
    load = for_supervisor(sup)  # the profile's [load] table: requests to READY servers
    if load is not None:
        sup.load = load  # its counts go out with the fleet's status
        load.start()
    try:
        await sup.run()
    finally:
        if load is not None:
            await load.stop()
        # Let a last /fleet or /shutdown answer go out before the socket disappears.
        await asyncio.sleep(0.2)
        for task in (api, metrics_port):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        remove_socket(paths.socket)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenspeed-supervisor")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args(argv)
    os.umask(0o077)  # state, history and logs are the operator's alone
    paths = StatePaths(Path(args.state_dir).resolve())
    paths.ensure()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per health check and scrape would bury what matters (starts, exits, restarts).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    log = logging.getLogger("tokenspeed.supervisor")
    lock = _lock(paths)
    if lock is None:
        log.error("another supervisor already runs in %s", paths.root)
        return 3
    try:
        # Resolved once, for the GPUs the probe sees (the seed's defaults depend on them): the plan and
        # every server's command line come from this resolution.
        platform = platform_facts(probe_gpus())
        resolved = load_and_resolve(args.profile, platform)
    except (ProfileError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    me = psutil.Process()
    paths.pid_file.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
    log.info(
        "supervising fleet %s (%d servers) from %s",
        resolved.profile.fleet.name,
        len(resolved.servers),
        paths.root,
    )
    try:
        asyncio.run(_main(paths, resolved, platform))
    finally:
        with contextlib.suppress(FileNotFoundError):
            paths.pid_file.unlink()
        lock.close()
    log.info("fleet %s stopped", resolved.profile.fleet.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
