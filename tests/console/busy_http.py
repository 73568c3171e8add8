"""A busy supervised test server: numbered log lines at a steady rate, OpenAI-style answers, a child.

    python tests/console/busy_http.py [--log-lines-per-s N] [--child] [tokenspeed serve flags...]

Only --host, --port and --node-rank of the serve flags matter. Every log line reads
`NAME pid PID line N` (N counts from 0, one write per line), so a reader can check that no line is
lost or repeated across log rotations and restarts. /health and /metrics answer like a TokenSpeed
server (supervised_http.py); POST /v1/completions and /v1/chat/completions answer 200 with a usage
block, or 400 with an OpenAI error body while $FAKE_CONTROL_DIR/NAME.reject exists. `--child` starts
one child process that lives as long as the server, like a scheduler rank.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from supervised_http import AnswerHandler, flag, metrics_text  # noqa: E402 - this file runs as a script

NAME = os.environ.get("TOKENSPEED_SERVER_NAME", "server")
REJECTION = "max_tokens must be at most 8 for this test server"


class Handler(AnswerHandler):
    CONTENT_TYPE = "application/json"

    def do_GET(self):  # noqa: N802 - the http.server API
        if self.path == "/health":
            self._send(200, "", "text/plain")
        elif self.path == "/metrics":
            self._send(200, metrics_text(), "text/plain")
        else:
            self._send(404, "{}")

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, "{}")
        elif flag("reject"):
            error = {"message": REJECTION, "type": "invalid_request_error", "param": "max_tokens"}
            self._send(400, json.dumps({"object": "error", "error": error}))
        else:
            usage = {"prompt_tokens": 4, "completion_tokens": int(body.get("max_tokens") or 1)}
            self._send(200, json.dumps({"id": "x", "choices": [{"text": " ok"}], "usage": usage}))


def chatter(lines_per_s: float) -> None:
    """Numbered lines at `lines_per_s`, written in small bursts so the rate holds on a busy machine."""
    out = sys.stdout
    pid = os.getpid()
    started = time.monotonic()
    n = 0
    while True:
        due = int((time.monotonic() - started) * lines_per_s)
        while n < due:
            out.write(f"{NAME} pid {pid} line {n}\n")
            out.flush()  # one write per line: whole lines reach the log
            n += 1
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-lines-per-s", type=float, default=0.0)
    parser.add_argument("--child", action="store_true")
    args, _ = parser.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if args.child:
        # The child sleeps until killed: only a stop of the whole process group ends it.
        subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    if args.log_lines_per_s > 0:
        threading.Thread(target=chatter, args=(args.log_lines_per_s,), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
