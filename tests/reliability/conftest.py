"""Shared set-up for the serving reliability tests: a tiny model and real `tokenspeed serve` processes."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.server.server_proc import ServerProc, launch  # noqa: E402
from tests.tiny_models import make_tiny_model  # noqa: E402

API_KEY = "reliability-key"
SERVED_NAME = "tiny-llama"
IDLE_STOP_S = 3.0
DRAIN_TIMEOUT_S = 1.0


@pytest.fixture(scope="session")
def reliability_model(tmp_path_factory) -> str:
    return make_tiny_model("llama", tmp_path_factory.mktemp("reliability-model"))


@pytest.fixture(scope="session")
def servers(reliability_model, tmp_path_factory) -> dict[str, ServerProc]:
    """Every server these tests need, started at once (start-up is mostly imports, done in parallel):

    - "served" stays up for the tests that leave it running (bad input, the schema fuzz, stalls,
      disconnects); its teardown is itself a check: whatever they sent, nothing is left in flight and an
      idle SIGTERM ends it within IDLE_STOP_S (a request leaked in flight kept it up for the whole drain);
    - "crashing" has its scheduler killed, "draining" is stopped with a drain timeout of DRAIN_TIMEOUT_S.
    """
    logs = tmp_path_factory.mktemp("reliability-logs")
    common = ("--served-model-name", SERVED_NAME, "--enable-metrics", "--max-num-seqs", "256")
    # The servers that are cut short serve answers far longer than a drain timeout: a 3000-token request
    # (RoPE extended past the tiny model's 512 positions) cannot finish inside it even on an idle machine.
    failing = (*common, "--enable-log-request-stats", "--hf-overrides", '{"max_position_embeddings": 4096}')
    names = ["served", "crashing", "draining"]
    procs = [
        launch(reliability_model, logs, *common, api_key=API_KEY),
        launch(reliability_model, logs, *failing),
        launch(reliability_model, logs, *failing, env={"TOKENSPEED_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT_S)}),
    ]
    try:
        for p in procs:
            p.wait_ready()
        yield dict(zip(names, procs, strict=True))
    except BaseException:
        for p in procs:
            p.stop(signal.SIGKILL, timeout=10)
        raise
    else:
        for p in procs[1:]:
            p.stop(signal.SIGKILL, timeout=10)
        idle_then_stop(procs[0])


@pytest.fixture(scope="session")
def served(servers) -> ServerProc:
    return servers["served"]


def inflight(srv: ServerProc) -> int:
    return httpx.get(f"{srv.url}/get_server_info", headers=srv.headers, timeout=10).json()[
        "num_inflight_requests"
    ]


def wait_idle(srv: ServerProc, timeout: float = 20.0) -> int:
    """Requests still in flight after `timeout` (0 once the server let go of every one)."""
    deadline = time.monotonic() + timeout
    n = inflight(srv)
    while n and time.monotonic() < deadline:
        time.sleep(0.1)
        n = inflight(srv)
    return n


def idle_then_stop(srv: ServerProc) -> None:
    if srv.proc.poll() is not None:
        return
    left = wait_idle(srv)
    started = time.monotonic()
    code = srv.stop(signal.SIGTERM, timeout=60)
    took = time.monotonic() - started
    assert left == 0, f"{left} request(s) left in flight:\n{srv.log()[-3000:]}"
    assert code == 0, f"exit status {code}:\n{srv.log()[-3000:]}"
    assert took < IDLE_STOP_S, f"an idle SIGTERM took {took:.1f} s:\n{srv.log()[-3000:]}"
