"""A small HTTP process for supervisor tests: answers /health and /metrics like a TokenSpeed server.

It takes `tokenspeed serve`'s command line (only --host and --port matter) and is steered by files in
$FAKE_CONTROL_DIR named after $TOKENSPEED_SERVER_NAME:
  NAME.crash         exit with code 3 right after start (a crash loop)
  NAME.ignore_term   ignore SIGTERM (the supervisor must SIGKILL after stop_timeout)
  NAME.unhealthy     /health answers 503
  NAME.stall         the scheduler step counter stands still (requests stay in flight): a stalled scheduler
  NAME.errors        its text, a number, is the count of HTTP 503 answers on /metrics
  NAME.drain_s       its text, seconds: on SIGTERM keep answering (in flight counting down) that long
Each start appends a line to NAME.starts, so tests can count starts. `GET /say?WORDS` prints WORDS on
stdout (a line of its log), so tests can write into a server's log when they choose. Each start also
appends its arguments (a JSON list) to NAME.argv; with FAKE_CHILD=1 in its environment it starts a child
process, as `tokenspeed serve` starts its scheduler ranks, and writes the child's pid to NAME.child.
"""

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

NAME = os.environ.get("TOKENSPEED_SERVER_NAME", "server")
CONTROL = Path(os.environ.get("FAKE_CONTROL_DIR", "."))
STARTED = time.time()
PLANNED: dict = {}  # the plan's values this process was started with


def flag(kind: str) -> bool:
    return (CONTROL / f"{NAME}.{kind}").exists()


STEPS = {"n": 0.0, "at": time.time()}
DRAINING = {"since": None}


def steps() -> int:
    """Ten steps a second, standing still while NAME.stall exists."""
    now = time.time()
    if not flag("stall"):
        STEPS["n"] += (now - STEPS["at"]) * 10
    STEPS["at"] = now
    return int(STEPS["n"])


def number(kind: str) -> float:
    try:
        return float((CONTROL / f"{NAME}.{kind}").read_text())
    except (OSError, ValueError):
        return 0.0


def metrics_text() -> str:
    up = time.time() - STARTED
    n = int(up * 10)
    in_flight = 4 if DRAINING["since"] is None else max(0, 4 - int(time.time() - DRAINING["since"]))
    return "\n".join(
        [
            "# TYPE tokenspeed:scheduler_steps counter",
            f'tokenspeed:scheduler_steps_total{{model_name="fake",dp_rank="0"}} {steps()}',
            "# TYPE tokenspeed:num_requests_inflight gauge",
            f'tokenspeed:num_requests_inflight{{model_name="fake",dp_rank="0"}} {in_flight}',
            "# TYPE tokenspeed:http_responses counter",
            f'tokenspeed:http_responses_total{{model_name="fake",status="200"}} {n}',
            f'tokenspeed:http_responses_total{{model_name="fake",status="503"}} {number("errors")}',
            "# TYPE tokenspeed:num_requests_running gauge",
            'tokenspeed:num_requests_running{model_name="fake",dp_rank="0"} 3',
            "# TYPE tokenspeed:num_requests_waiting gauge",
            'tokenspeed:num_requests_waiting{model_name="fake",dp_rank="0"} 1',
            "# TYPE tokenspeed:kv_cache_usage_perc gauge",
            'tokenspeed:kv_cache_usage_perc{model_name="fake",dp_rank="0"} 0.25',
            "# TYPE tokenspeed:generation_tokens counter",
            f'tokenspeed:generation_tokens_total{{model_name="fake"}} {n * 20}',
            "# TYPE tokenspeed:num_requests counter",
            f'tokenspeed:num_requests_total{{model_name="fake"}} {n}',
            "# TYPE tokenspeed:time_to_first_token_seconds histogram",
            f'tokenspeed:time_to_first_token_seconds_bucket{{le="0.1",model_name="fake"}} {n}',
            f'tokenspeed:time_to_first_token_seconds_bucket{{le="0.5",model_name="fake"}} {2 * n}',
            f'tokenspeed:time_to_first_token_seconds_bucket{{le="+Inf",model_name="fake"}} {2 * n}',
            f'tokenspeed:time_to_first_token_seconds_count{{model_name="fake"}} {2 * n}',
            f'tokenspeed:time_to_first_token_seconds_sum{{model_name="fake"}} {0.2 * n}',
            "",
        ]
    )


class AnswerHandler(BaseHTTPRequestHandler):
    """Answers with one whole body, and logs no request line: the log holds what the server itself says.
    The stand-in servers (this one, busy_http.py, metrics_endpoint.py) handle requests on top of it."""

    #: the Content-Type of an answer that names none
    CONTENT_TYPE = "text/plain"

    def _send(self, code: int, body: str, ctype: str | None = None) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype or self.CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        return


class Handler(AnswerHandler):

    def do_GET(self):  # noqa: N802 - the http.server API
        if self.path == "/health":
            self._send(503 if flag("unhealthy") else 200, "")
        elif self.path == "/metrics":
            self._send(200, metrics_text())
        elif self.path.startswith("/say?"):
            print(self.path.split("?", 1)[1], flush=True)
            self._send(200, "")
        elif self.path == "/get_server_info":
            info = {"model": "fake", "name": NAME, **PLANNED}
            self._send(200, json.dumps(info), "application/json")
        else:
            self._send(404, "")

    def do_POST(self):  # noqa: N802
        if self.path == "/flush_cache":
            self._send(200, '{"flushed": true}', "application/json")
        else:
            self._send(404, "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node-rank", type=int, default=0)
    # What a planned server reports back in /get_server_info (a real one resolves these and sizes KV).
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--cudagraph-capture-sizes", type=int, nargs="+")
    args, _ = parser.parse_known_args()
    if args.gpu_memory_utilization is not None:
        PLANNED.update(
            gpu_memory_utilization=args.gpu_memory_utilization,
            cudagraph_capture_sizes=args.cudagraph_capture_sizes,
        )
    with open(CONTROL / f"{NAME}.starts", "a") as f:
        f.write(f"{os.getpid()}:{args.node_rank}\n")
    with open(CONTROL / f"{NAME}.argv", "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
    if os.environ.get("FAKE_CHILD") == "1":
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        (CONTROL / f"{NAME}.child").write_text(str(child.pid))
    print(f"{NAME} starting on {args.host}:{args.port}", flush=True)
    if flag("crash"):
        print(f"{NAME} crashing", flush=True)
        sys.exit(3)
    if flag("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif number("drain_s") > 0:
        # Like a real server draining: still answering, requests in flight finishing, then exit 0.
        def drain(*_):
            DRAINING["since"] = time.time()
            import threading

            threading.Timer(number("drain_s"), lambda: os._exit(0)).start()

        signal.signal(signal.SIGTERM, drain)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.node_rank > 0:
        # Like a scheduler-only node of a multi-node server: no HTTP, runs until stopped.
        print(f"{NAME} node rank {args.node_rank} waiting", flush=True)
        while True:
            time.sleep(1)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"{NAME} ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
