"""Real `python -m tokenspeed serve` processes for the serving tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

START_TIMEOUT_S = 240.0  # a loaded 2-core CI machine needs a while to import torch in every process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m tokenspeed ARGS` to completion, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed", *args], capture_output=True, text=True, timeout=timeout
    )


def free_port_block(span: int = 16) -> int:
    """A port P with P..P+span-1 free, below the kernel's ephemeral range.

    A multi-node server's addresses sit at fixed offsets from --dist-init-addr; picking them outside the
    range the kernel hands to outgoing connections keeps another test's client socket off them.
    """
    import random

    from tokenspeed.config.ports import is_port_available

    low = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    high = max(low + 1000, ephemeral) - span
    for _ in range(1000):
        base = random.randrange(low, high)
        if all(is_port_available(p) for p in range(base, base + span)):
            return base
    raise RuntimeError(f"no {span} free ports in a row between {low} and {high}")


@dataclass
class ServerProc:
    proc: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} during start-up:\n{self.log()[-4000:]}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{self.log()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def openai_client(self, timeout: float = 120.0):
        """The official `openai` client for this server's /v1 routes, with its API key; no retries, so a
        failure shows as it happened."""
        import openai  # the test extra installs it; the tests that drive /v1 through it import this

        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0, timeout=timeout
        )

    def server_info(self) -> dict:
        return httpx.get(f"{self.url}/get_server_info", headers=self.headers, timeout=10).json()


def launch(
    model: str, log_dir: Path, *args: str, api_key: str | None = None, env: dict | None = None
) -> ServerProc:
    port = free_port()
    log_path = Path(log_dir) / f"server-{port}.log"
    cmd = [sys.executable, "-m", "tokenspeed", "serve", model, "--device", "cpu", "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    with open(log_path, "wb") as log:
        # Its own process group, as under the supervisor, so a test can signal the whole group.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    return ServerProc(proc=proc, port=port, log_path=log_path, api_key=api_key)


@contextmanager
def served(
    model: str,
    log_dir: Path,
    *args: str,
    api_key: str | None = None,
    env: dict | None = None,
    stop_timeout: float = 60.0,
) -> Iterator[ServerProc]:
    """A ready server for the body of the `with`, stopped by SIGTERM afterwards.

    A clean stop is part of what every such test checks: once the body has passed, the server must exit 0
    (a request left in flight or a rank that fails to stop shows up here). When the body or the start-up
    failed, that failure is what the test reports, so the exit status is not checked on top of it.
    """
    srv = launch(model, log_dir, *args, api_key=api_key, env=env)
    try:
        srv.wait_ready()
        yield srv
    except BaseException:
        srv.stop(signal.SIGTERM, timeout=stop_timeout)
        raise
    code = srv.stop(signal.SIGTERM, timeout=stop_timeout)
    assert code == 0, f"server exit status {code}:\n{srv.log()[-3000:]}"


def module_server(model: str, logs: str, *args: str):
    """A module-scoped fixture: `model` served with `args` (see `served`) for all of a module's tests, its
    log in a fresh folder named after `logs`. The module names it by assignment: `srv = module_server(...)`."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory) -> Iterator[ServerProc]:
        """A server of this module's own, started once for its tests."""
        with served(model, tmp_path_factory.mktemp(logs), *args) as srv:
            yield srv

    return fixture


def launch_all(specs: list[tuple[str, Path, tuple[str, ...]]], **kw) -> list[ServerProc]:
    """Start several servers at once (start-up is mostly waiting for imports), then wait for each."""
    servers = [launch(model, log_dir, *args, **kw) for model, log_dir, args in specs]
    try:
        for s in servers:
            s.wait_ready()
    except BaseException:
        for s in servers:
            s.stop(signal.SIGKILL, timeout=10)
        raise
    return servers
