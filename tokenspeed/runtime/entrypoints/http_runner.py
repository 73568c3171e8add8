"""Running the HTTP front end: uvicorn with TokenSpeed's shutdown rules, warm-up and the child watchdog.

uvicorn's own signal handling stops at once and re-raises the signal after shutdown (so the exit status
would say "killed by SIGTERM"). Here the first SIGTERM/SIGINT drains: status "draining", new requests get
503, in-flight ones have `TOKENSPEED_DRAIN_TIMEOUT` seconds (default 30) to finish before they are
cut off, then the server stops and the process exits 0. A second signal stops at once. A request cut off
(by the drain timeout, a second signal or a dead scheduler) is an error to its client (503 or 500, or an
error event on a stream), never an answer that looks complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import uvicorn

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.process_watchdog import ChildProcess, ChildWatchdog
from tokenspeed.runtime.engine.request_state import RequestFailure
from tokenspeed.runtime.entrypoints.http_server import build_app
from tokenspeed.runtime.entrypoints.server_state import DRAINING, READY, ServerState
from tokenspeed.runtime.entrypoints.warmup import run_warmups
from tokenspeed.runtime.startup_phases import StartupPhases, format_phases, process_started_at

logger = logging.getLogger("tokenspeed.serve")

EXIT_OK, EXIT_FAILED = 0, 1
_DEFAULT_DRAIN_S = 30.0
# After a child died: the front end gets this long to wind down before the process is cut short.
_FATAL_DEADLINE_S = 5.0
# After the requests in flight were failed: how long their handlers get to send the error to their clients
# before the server stops.
_FLUSH_ERRORS_S = 1.0


def drain_timeout() -> float:
    raw = os.environ.get("TOKENSPEED_DRAIN_TIMEOUT")
    if raw is None:
        return _DEFAULT_DRAIN_S
    try:
        return max(0.0, float(raw))
    except ValueError as exc:
        raise ValueError(f"TOKENSPEED_DRAIN_TIMEOUT must be a number of seconds, got {raw!r}") from exc


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.exit_code = EXIT_OK
        self.loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: Any) -> None:
        if self._draining:
            name = signal.Signals(sig).name
            logger.warning("second %s: stopping now", name)
            failure = RequestFailure.shutdown(
                f"the server was stopped (a second {name}) before this request finished"
            )
            if self.loop is not None:
                self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._stop_now(failure)))
            else:
                self.should_exit = self.force_exit = True
            return
        self._draining = True
        logger.info("%s: draining (no new requests; in-flight ones may finish)", signal.Signals(sig).name)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._drain()))
        else:
            self.should_exit = True

    async def _drain(self) -> None:
        self.state.status = DRAINING
        self.state.llm.accepting = False
        timeout = drain_timeout()
        if not await self.state.llm.wait_idle(timeout):
            logger.warning("%d request(s) still running after %g s: aborting them", self.state.llm.num_inflight,
                           timeout)  # fmt: skip
            self.state.llm.abort_all(
                RequestFailure.shutdown(
                    f"the server is shutting down and this request did not finish within the drain timeout "
                    f"(TOKENSPEED_DRAIN_TIMEOUT={timeout:g} s); retry it on another server"
                )
            )
            await self.state.llm.wait_idle(2.0)
        self.should_exit = True

    async def _stop_now(self, failure: RequestFailure) -> None:
        """Fail what is in flight, give the handlers a moment to tell their clients, then stop."""
        self.state.llm.accepting = False
        self.state.llm.abort_all(failure)
        await self.state.llm.wait_idle(_FLUSH_ERRORS_S)
        await asyncio.sleep(0.1)  # the handlers' last events ([DONE]) are written after they let go
        self.should_exit = self.force_exit = True

    def fatal(self, reason: str) -> None:
        """A child died: fail what is in flight, stop serving, exit non-zero (forcibly if it hangs)."""
        logger.error("%s; shutting the server down", reason)
        self.exit_code = EXIT_FAILED
        self.state.status = DRAINING
        failure = RequestFailure.internal(
            f"the server failed and is shutting down ({reason}); the request was cut off",
            code="server_failed",
        )
        if self.loop is not None:
            self.loop.create_task(self._stop_now(failure))
        else:
            self.state.llm.abort_all(failure)
            self.should_exit = self.force_exit = True
        timer = threading.Timer(_FATAL_DEADLINE_S, lambda: os._exit(EXIT_FAILED))
        timer.daemon = True
        timer.start()


async def run_http(state: ServerState, procs: Any, warmups: list[str], startup: StartupPhases) -> int:
    """Serve until stopped; `startup` holds the front end's start-up phases so far, logged at READY."""
    http_began = time.monotonic()
    args = state.server_args
    http_level = (args.log_level_http or args.log_level or "info").lower()
    config = uvicorn.Config(
        build_app(state),
        host=args.host,
        port=args.port,
        log_level=http_level,
        access_log=args.log_level_http is not None and http_level in ("debug", "info"),
        loop="asyncio",
        http="h11",
        lifespan="off",
        timeout_keep_alive=5,
    )
    server = DrainingServer(config, state)
    server.loop = asyncio.get_running_loop()

    def on_death(child: ChildProcess, code: int | None) -> None:
        reason = f"{child.name} (pid {child.process.pid}) exited with code {code}"
        server.loop.call_soon_threadsafe(server.fatal, reason)

    watchdog = ChildWatchdog(procs.children, on_death).start()
    warm = asyncio.get_running_loop().create_task(_warm_up(server, state, warmups, startup, http_began))
    try:
        await server.serve()
    finally:
        watchdog.stop()
        warm.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await warm
    if server.exit_code == EXIT_OK and not server.started:
        return EXIT_FAILED  # uvicorn could not bind or start
    return server.exit_code


async def _warm_up(
    server: DrainingServer, state: ServerState, warmups: list[str], startup: StartupPhases, http_began: float
) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    startup.add("HTTP server", time.monotonic() - http_began)
    try:
        with state.llm.liveness.warming_up(), startup.phase("warm-up"):
            await run_warmups(state.llm, warmups)
    except Exception as exc:
        logger.error("warm-up failed: %s", exc)
        server.exit_code = EXIT_FAILED
        server.should_exit = True
        return
    if state.status == DRAINING:
        return
    # Forking a process that has grown to its serving size takes a while: done before traffic, not with the
    # first large body (the streams of that moment would pause for it).
    with startup.phase("request body workers"):
        await state.bodies.start()
    state.status = READY
    state.llm.accepting = True
    total = time.time() - process_started_at()
    # The schedulers load while the front end does its own part: "waiting for the schedulers" is what of
    # their start-up (each rank's own line says where its seconds went) the front end could not hide.
    logger.info("front end start-up: %s", format_phases(startup.summary(total)))
    logger.info(
        "the server is ready on %s (%d child processes), %.1f s after it started",
        args_url(state.server_args), len(state.child_pids), total,
    )  # fmt: skip


def args_url(server_args: ServerArgs) -> str:
    return server_args.url()
