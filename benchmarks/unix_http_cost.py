"""Why the supervisor client keeps its own HTTP/1.1 pool (console/unix_http.py) rather than httpx.

    python benchmarks/unix_http_cost.py [--servers 8] [--requests 300] [--rounds 5]
        [--out benchmarks/results/unix_http_cost.json]

A real supervisor runs N lightweight metrics endpoints (tests/console/metrics_endpoint.py, as in
console_cost.py). The same client process then asks it the console's questions over its unix socket, GET
/fleet and GET /events, first through `UnixHTTP` and then through `httpx.Client` with a unix-socket
transport, both keeping their connection alive. Measured: this process's CPU time per request (user +
system; the supervisor's own work is in another process and counts for neither). Rounds alternate the two
clients so that load elsewhere on the machine falls on both alike; the figure is the median round.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tokenspeed.bench_results import write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.console_cost import write_profile  # noqa: E402
from console.client import SupervisorClient  # noqa: E402
from console.supervisor.paths import StatePaths  # noqa: E402
from console.tui.launch import start_supervisor  # noqa: E402
from console.unix_http import UnixHTTP  # noqa: E402

PATHS = ("/fleet", "/events?seconds=300")


def cpu_ms_per_request(get: Callable[[str], bytes], requests: int) -> float:
    before = time.process_time()
    for i in range(requests):
        body = get(PATHS[i % len(PATHS)])
        assert body.startswith(b"{"), body[:80]  # a JSON answer, not an error page
    return 1000 * (time.process_time() - before) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300, help="requests per client per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "unix_http_cost.json"))
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="tsb-"))
    state_dir = root / "state"
    profile = write_profile(root, args.servers)
    socket_path = str(StatePaths(state_dir.resolve()).socket)
    supervisor = SupervisorClient(state_dir, timeout=10.0)
    own = UnixHTTP(socket_path, timeout=10.0)
    other = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://supervisor", timeout=10.0)
    clients: dict[str, Callable[[str], bytes]] = {
        "unix_http": lambda url: own.request("GET", url).content,
        "httpx": lambda url: other.get(url).content,
    }
    try:
        start_supervisor(profile, state_dir, timeout=180)
        deadline = time.monotonic() + 300
        while not all(s["state"] == "READY" and s["metrics"] for s in supervisor.fleet()["servers"]):
            if time.monotonic() > deadline:
                raise TimeoutError("fleet not READY")
            time.sleep(0.5)
        answer_bytes = {url: len(own.request("GET", url).content) for url in PATHS}
        for get in clients.values():  # warm: connections open, code paths imported
            cpu_ms_per_request(get, 20)
        rounds: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(args.rounds):
            for name, get in clients.items():
                rounds[name].append(cpu_ms_per_request(get, args.requests))
    finally:
        try:
            supervisor.shutdown()
        finally:
            own.close()
            other.close()

    median = {name: statistics.median(values) for name, values in rounds.items()}
    result = {
        "what": "client CPU time per request to a real supervisor over its unix socket, kept-alive connection",
        "servers": args.servers,
        "paths": list(PATHS),
        "answer_bytes": answer_bytes,
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "cpu_ms_per_request_median": {name: round(v, 4) for name, v in median.items()},
        "cpu_ms_per_request_rounds": {name: [round(v, 4) for v in vs] for name, vs in rounds.items()},
        "httpx_over_unix_http": round(median["httpx"] / median["unix_http"], 2),
        "httpx_version": httpx.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(result, indent=2))
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
