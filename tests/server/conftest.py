"""Shared set-up for the serving tests: a tiny model and one real server for the whole session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.server.server_proc import ServerProc, served  # noqa: E402
from tests.tiny_models import make_tiny_model  # noqa: E402

API_KEY = "test-key-123"
SERVED_NAME = "tiny-llama"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return make_tiny_model("llama", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def server(tiny_model, tmp_path_factory) -> ServerProc:
    """One server with the optional features on; tests that need a different set-up start their own."""
    with served(
        tiny_model,
        tmp_path_factory.mktemp("server-logs"),
        "--served-model-name", SERVED_NAME,
        "--enable-metrics",
        "--enable-cache-report",
        "--enable-output-logprobs",
        # structured output is on by default: off here, so its 400s are checked (test_api_support.py)
        "--grammar-backend", "none",
        "--enable-log-request-stats",
        "--enable-log-requests",
        "--log-requests-level", "1",
        "--preferred-sampling-params", '{"top_k": 50}',
        "--max-num-seqs", "256",
        api_key=API_KEY,
    ) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(srv):
    """The official `openai` client of the module's own `srv` server (a module defines `srv`)."""
    return srv.openai_client()
