"""A `tokenspeed serve` process that a CPU benchmark starts for itself on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    serve_args: list[str], log: Path | None = None, timeout_s: float = 300.0
) -> tuple[subprocess.Popen, str]:
    """`python -m tokenspeed serve SERVE_ARGS --port P` in its own session, its output written to `log` (or
    dropped); returns the process and its base URL once /health answers 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "tokenspeed", "serve", *serve_args, "--port", str(port)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    see = f"; see {log}" if log else ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while starting{see}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not become healthy within {timeout_s:.0f} s{see}")
