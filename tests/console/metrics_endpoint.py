"""A lightweight stand-in server process for console tests and benchmarks: real HTTP, no model.

    python tests/console/metrics_endpoint.py --host 127.0.0.1 --port 30000 [any serve flags...]

A fleet profile runs it through `[fleet] command`, so the supervisor starts, health-checks, scrapes,
restarts and stops it like a `tokenspeed serve`. It answers /health, /metrics (the scheduler, KV,
request-latency histograms and expert-load families, moving with time), /get_server_info,
/flush_cache and the expert-recording switches, and writes log lines at several levels.
Its numbers are a function of time since start and the port, so two runs look alike.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from supervised_http import AnswerHandler  # this file runs as a script, from its own folder

LAYERS = 4
EXPERTS = 8
EP_SIZE = 2
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16)


class Endpoint:
    def __init__(self, name: str, host: str, port: int, argv: list[str]) -> None:
        self.name, self.host, self.port, self.argv = name, host, port, argv
        self.started = time.time()
        self.seed = port % 7
        self.recording = True
        self.flushes = 0
        self.lock = threading.Lock()

    def log(self, level: str, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{stamp} {level} endpoint {self.name}: {message}", flush=True)

    def metrics(self) -> str:
        t = time.time() - self.started
        s = self.seed
        requests = int(t * (2 + s))
        lines = [
            "# TYPE tokenspeed:num_requests_running gauge",
            f'tokenspeed:num_requests_running{{model_name="tiny"}} {2 + s % 3}',
            "# TYPE tokenspeed:num_requests_waiting gauge",
            f'tokenspeed:num_requests_waiting{{model_name="tiny"}} {int(t) % 4}',
            "# TYPE tokenspeed:kv_cache_usage_perc gauge",
            f'tokenspeed:kv_cache_usage_perc{{model_name="tiny"}} {0.4 + 0.3 * math.sin(t / 7 + s):.4f}',
            "# TYPE tokenspeed:gen_throughput gauge",
            f'tokenspeed:gen_throughput{{model_name="tiny"}} {100 + 10 * s + 20 * math.sin(t / 5):.2f}',
            "# TYPE tokenspeed:prefix_cache_queries counter",
            f'tokenspeed:prefix_cache_queries_total{{model_name="tiny"}} {requests * 10}',
            "# TYPE tokenspeed:prefix_cache_hits counter",
            f'tokenspeed:prefix_cache_hits_total{{model_name="tiny"}} {requests * 6}',
            "# TYPE tokenspeed:num_requests counter",
            f'tokenspeed:num_requests_total{{model_name="tiny"}} {requests}',
            "# TYPE tokenspeed:request_success counter",
            f'tokenspeed:request_success_total{{model_name="tiny"}} {requests - requests // 50}',
            "# TYPE tokenspeed:generation_tokens counter",
            f'tokenspeed:generation_tokens_total{{model_name="tiny"}} {int(t * (100 + 10 * s))}',
        ]
        lines += _histogram("time_to_first_token_seconds", TTFT_BUCKETS, requests, 0.05 * (1 + s / 7))
        lines += _histogram("inter_token_latency_seconds", ITL_BUCKETS, requests * 20, 0.01 * (1 + s / 7))
        lines += ["# TYPE tokenspeed:expert_load gauge"]
        for layer in range(LAYERS):
            for expert in range(EXPERTS):
                hot = 4.0 if expert == (layer + s) % EXPERTS else 1.0
                load = int((t + 10) * hot * (1 + expert / EXPERTS)) if self.recording else 0
                lines.append(
                    f'tokenspeed:expert_load{{model_name="tiny",layer="{layer}",expert="{expert}"}} {load}'
                )
        lines += ["# TYPE tokenspeed:eplb_balancedness gauge"]
        for layer in range(LAYERS):
            lines.append(
                f'tokenspeed:eplb_balancedness{{model_name="tiny",layer="{layer}"}} {0.55 + 0.1 * layer}'
            )
        lines += [
            "# TYPE tokenspeed:eplb_rebalances counter",
            f"tokenspeed:eplb_rebalances_total {int(t // 30)}",
        ]
        return "\n".join(lines) + "\n"

    def info(self) -> dict:
        return {
            "server_args": {
                "model": "tiny-endpoint",
                "host": self.host,
                "port": self.port,
                "tp_size": 1,
                "ep_size": EP_SIZE,
                "enable_metrics": True,
                "argv": " ".join(self.argv),
            },
            "mapping": {"world_size": 1, "tp_size": 1, "ep_size": EP_SIZE, "dp_size": 1},
        }


def _histogram(name: str, bounds: tuple[float, ...], count: int, median: float) -> list[str]:
    out = [f"# TYPE tokenspeed:{name} histogram"]
    total = 0.0
    for le in bounds:
        # A log-logistic shape around the median, so p50 and p99 land in different buckets.
        share = 1.0 / (1.0 + (median / le) ** 3)
        out.append(f'tokenspeed:{name}_bucket{{model_name="tiny",le="{le}"}} {int(count * share)}')
        total += le * count * share / len(bounds)
    out.append(f'tokenspeed:{name}_bucket{{model_name="tiny",le="+Inf"}} {count}')
    out.append(f'tokenspeed:{name}_count{{model_name="tiny"}} {count}')
    out.append(f'tokenspeed:{name}_sum{{model_name="tiny"}} {total:.4f}')
    return out


def make_handler(endpoint: Endpoint):
    class Handler(AnswerHandler):
        CONTENT_TYPE = "application/json"

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                self._send(200, "{}")
            elif path == "/metrics":
                self._send(200, endpoint.metrics(), "text/plain; version=0.0.4")
            elif path == "/get_server_info":
                self._send(200, json.dumps(endpoint.info()))
            else:
                self._send(404, json.dumps({"error": f"no route {path}"}))

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/flush_cache":
                endpoint.flushes += 1
                endpoint.log("INFO", f"prefix cache flushed ({endpoint.flushes} so far)")
            elif path == "/start_expert_distribution_record":
                endpoint.recording = True
                endpoint.log("INFO", "expert distribution recording started")
            elif path == "/stop_expert_distribution_record":
                endpoint.recording = False
                endpoint.log("WARNING", "expert distribution recording stopped")
            else:
                self._send(404, json.dumps({"error": f"no route {path}"}))
                return
            self._send(200, json.dumps({"ok": True}))

    return Handler


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _rest = parser.parse_known_args(argv)
    name = os.environ.get("TOKENSPEED_SERVER_NAME", f"endpoint-{args.port}")
    endpoint = Endpoint(name, args.host, args.port, argv)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(endpoint))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    endpoint.log("INFO", f"listening on http://{args.host}:{args.port}")
    endpoint.log("DEBUG", f"arguments: {' '.join(argv)}")
    endpoint.log("WARNING", "this is a metrics endpoint without a model")
    endpoint.log("ERROR", "example error line for log filters")
    server.serve_forever(poll_interval=0.5)
    endpoint.log("INFO", "shutting down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
