"""A worker node of a multi-node server (`tokenspeed serve --nnodes N --node-rank K`, K > 0).

It runs only this node's scheduler processes; the head (node 0) owns the HTTP front end and the life of
the server. How a worker ends, and the exit status a supervisor reads from it:

- the head stops normally: each TP group's rank 0 sends its peers the stop message before it exits
  (`EngineCore.shutdown`), the peers here exit 0 on it, and the worker follows them: exit 0;
- the head crashes or its node goes away: the peers' collectives fail ("connection closed") and they
  exit non-zero within seconds; the worker stops whatever is left and exits 1;
- SIGTERM/SIGINT to the worker itself: it stops its schedulers and exits 0 (the head then loses
  those ranks, which is the head's failure to report).

A scheduler that exits 0 was told to stop by its group's rank 0: nothing else ends a scheduler cleanly
on a worker node without the worker asking.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from multiprocessing.connection import wait
from typing import Any

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.process_watchdog import ChildProcess

logger = logging.getLogger("tokenspeed.serve")

EXIT_OK, EXIT_FAILED = 0, 1
# After the first scheduler got the head's stop message, the others (stopped by the same message, one per
# TP group) get this long to follow before they are stopped from here.
STOP_FOLLOW_GRACE_S = 15.0


def run_worker_node(server_args: ServerArgs) -> int:
    from tokenspeed.runtime.engine.endpoints import ServerEndpoints
    from tokenspeed.runtime.entrypoints.launch import ServerProcesses

    endpoints = ServerEndpoints.from_server_args(server_args)
    procs = ServerProcesses(server_args, endpoints)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    stopped_by: list[str] = []

    def on_signal(sig: int, _frame: Any) -> None:
        stopped_by.append(signal.Signals(sig).name)
        try:
            os.write(wake_w, b"x")
        except BlockingIOError:
            pass

    node = server_args.node_rank
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        procs.start()
        logger.info(
            "node %d: %d scheduler rank(s) started; following the head node", node, len(procs.children)
        )
        code = _watch(procs.children, wake_r, stopped_by)
    finally:
        procs.shutdown()
        endpoints.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(wake_r)
        os.close(wake_w)
    logger.info("node %d stopped; exit status %d", node, code)
    return code


def _watch(children: list[ChildProcess], wake_r: int, stopped_by: list[str]) -> int:
    """Wait for the event that ends this node; returns the exit status."""
    running = {c.process.sentinel: c for c in children}
    head_stopped = False
    deadline: float | None = None
    while running:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([*running, wake_r], timeout=timeout)
        if stopped_by:
            logger.info("%s: stopping this node's scheduler ranks", stopped_by[0])
            return EXIT_OK
        if not ready:  # the grace period after the head's stop message ran out
            left = ", ".join(c.name for c in running.values())
            logger.warning("still running %.0f s after the head's stop message: %s; stopping them",
                           STOP_FOLLOW_GRACE_S, left)  # fmt: skip
            return EXIT_OK
        for sentinel in ready:
            child = running.pop(sentinel, None)
            if child is None:
                continue
            child.process.join(timeout=1)
            code = child.process.exitcode
            if code != 0:
                logger.error(
                    "%s (pid %s) exited with code %s%s; exiting %d",
                    child.name, child.process.pid, code,
                    "" if head_stopped else ": lost the head node (it crashed or cannot be reached) or this "
                    "rank failed, see the rank's log above",
                    EXIT_FAILED,
                )  # fmt: skip
                return EXIT_FAILED
            if not head_stopped:
                logger.info(
                    "%s got the stop message from the head node: the server is shutting down normally",
                    child.name,
                )
                head_stopped = True
                deadline = time.monotonic() + STOP_FOLLOW_GRACE_S
    logger.info("every scheduler rank of this node stopped with the head node; exiting %d", EXIT_OK)
    return EXIT_OK
