"""What the Grafana dashboard shows: each panel's PromQL, over metric names the fleet really exports.

Server series (`tokenspeed:*`, `process_*`) carry the target labels the supervisor's file_sd gives them
(fleet, server, group, node, model, role); the supervisor's series (`tokenspeed_fleet:*`) carry fleet and
`server` but no model, so their panels filter on fleet and server only. `$fleet`, `$server`, `$model` and
`$__rate_interval` are Grafana variables; tests/console/test_prometheus.py substitutes them and asks a
real Prometheus for every expression here.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVERS = 'fleet=~"$fleet", server=~"$server", model=~"$model"'
SUPERVISOR = 'fleet=~"$fleet", server=~"$server"'
RATE = "[$__rate_interval]"
# Grafana has no tokens unit; a custom suffix unit (`suffix:<text>`) is how Grafana spells one.
TOKENS_PER_S = "suffix: tok/s"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | heatmap | state-timeline
    description: str = ""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def _quantiles(metric: str) -> tuple[Query, ...]:
    """p50 and p99 per server from a histogram's buckets, as `histogram_quantile` reads them."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le, server) (rate(tokenspeed:{metric}_bucket{{{SERVERS}}}{RATE})))",
            f"{{{{server}}}} p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    )


def _per_server(metric: str, legend: str = "{{server}}") -> Query:
    return Query(f"sum by (server) (tokenspeed:{metric}{{{SERVERS}}})", legend)


def _rate(metric: str, by: str = "server", legend: str = "{{server}}") -> Query:
    return Query(f"sum by ({by}) (rate(tokenspeed:{metric}{{{SERVERS}}}{RATE}))", legend)


ROWS: tuple[Row, ...] = (
    Row(
        "Fleet (supervisor)",
        (
            Panel(
                "Server state",
                (
                    Query(
                        f"max by (server, state) (tokenspeed_fleet:server_state{{{SUPERVISOR}}}) == 1",
                        "{{server}} {{state}}",
                    ),
                ),
                kind="state-timeline",
                description="Each server's state as `tokenspeed status` shows it: STARTING, READY, STALLED (its "
                "scheduler ran no step or sent no heartbeat), UNHEALTHY, BACKOFF, STOPPING, STOPPED, FATAL.",
            ),
            Panel(
                "Servers by state",
                (Query('sum by (state) (tokenspeed_fleet:servers{fleet=~"$fleet"})', "{{state}}"),),
            ),
            Panel(
                "Restarts by reason",
                (
                    Query(
                        f"sum by (server, reason) (tokenspeed_fleet:server_restarts_total{{{SUPERVISOR}}})",
                        "{{server}} {{reason}}",
                    ),
                ),
                description="Restarts of each server by reason (exit_code, signal, startup_timeout, unhealthy, "
                "stalled, start_failed, unknown, operator); the counts survive supervisor restarts.",
            ),
            Panel(
                "Backoff before the next start",
                (
                    Query(
                        f"max by (server) (tokenspeed_fleet:server_backoff_seconds{{{SUPERVISOR}}})",
                        "{{server}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Uptime",
                (
                    Query(
                        f"time() - max by (server) (tokenspeed_fleet:server_last_start_time_seconds{{{SUPERVISOR}}})",
                        "{{server}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Health-check latency p99",
                (
                    Query(
                        "histogram_quantile(0.99, sum by (le, server) "
                        f"(rate(tokenspeed_fleet:health_check_seconds_bucket{{{SUPERVISOR}}}{RATE})))",
                        "{{server}}",
                    ),
                ),
                unit="s",
            ),
        ),
    ),
    Row(
        "Load",
        (
            Panel("Requests running", (_per_server("num_requests_running"),)),
            Panel("Requests waiting", (_per_server("num_requests_waiting"),)),
            Panel(
                "Tokens/s",
                (
                    _rate("generation_tokens_total", legend="{{server}} generated"),
                    _rate("prompt_tokens_total", legend="{{server}} prompt"),
                ),  # fmt: skip
                unit=TOKENS_PER_S,
            ),
            Panel(
                "Request outcomes",
                (_rate("request_success_total", by="finished_reason", legend="{{finished_reason}}"),),
                unit="reqps",
                description="Finished requests per second by finished_reason (stop, length, abort, error).",
            ),
            Panel("Preemptions/s", (_rate("num_preemptions_total"),), unit="ops"),
        ),
    ),
    Row(
        "Latency",
        (
            Panel("Time to first token", _quantiles("time_to_first_token_seconds"), unit="s"),
            Panel("Inter-token latency", _quantiles("inter_token_latency_seconds"), unit="s"),
            Panel("End-to-end latency", _quantiles("e2e_request_latency_seconds"), unit="s"),
            Panel("Queue time", _quantiles("request_queue_time_seconds"), unit="s"),
        ),
    ),
    Row(
        "KV cache",
        (
            Panel(
                "KV cache usage",
                (Query(f"max by (server) (tokenspeed:kv_cache_usage_perc{{{SERVERS}}})", "{{server}}"),),
                unit="percentunit",
            ),
            Panel(
                "Prefix cache hit rate",
                (
                    Query(
                        f"sum by (server) (rate(tokenspeed:prefix_cache_hits_total{{{SERVERS}}}{RATE})) / "
                        f"sum by (server) (rate(tokenspeed:prefix_cache_queries_total{{{SERVERS}}}{RATE}))",
                        "{{server}}",
                    ),
                ),
                unit="percentunit",
                description="Prompt tokens found in the prefix cache over prompt tokens looked up.",
            ),
        ),
    ),
    Row(
        "Experts (MoE)",
        (
            Panel(
                "EPLB balancedness",
                (
                    Query(
                        f"min by (server, layer) (tokenspeed:eplb_balancedness{{{SERVERS}}})",
                        "{{server}} layer {{layer}}",
                    ),
                ),
                description="Mean over max tokens per EP rank, per MoE layer; 1.0 is balanced.",
            ),
            Panel(
                "Expert load",
                (Query(f"sum by (expert) (tokenspeed:expert_load{{{SERVERS}}})", "{{expert}}"),),
                kind="heatmap",
                description="Tokens routed to each expert over the recorder window, all layers of the selected servers.",
            ),
        ),
    ),
    Row(
        "Processes",
        (
            Panel(
                "CPU",
                (
                    Query(
                        f"sum by (server, process) (rate(tokenspeed:server_process_cpu_seconds_total{{{SERVERS}}}{RATE}))",
                        "{{server}} {{process}}",
                    ),
                    Query(
                        f'sum by (fleet) (rate(process_cpu_seconds_total{{fleet=~"$fleet", role="supervisor"}}{RATE}))',
                        "supervisor {{fleet}}",
                    ),
                ),
                unit="percentunit",
                description="CPU of every process of each server (front end, schedulers, DP controller; "
                "100% is one core), and of the supervisor.",
            ),
            Panel(
                "Resident memory",
                (
                    Query(
                        f"sum by (server, process) (tokenspeed:server_process_resident_memory_bytes{{{SERVERS}}})",
                        "{{server}} {{process}}",
                    ),
                    Query(
                        'sum by (fleet) (process_resident_memory_bytes{fleet=~"$fleet", role="supervisor"})',
                        "supervisor {{fleet}}",
                    ),
                ),
                unit="bytes",
                description="Resident memory of every process of each server (the schedulers hold the model "
                "and KV pool), and of the supervisor.",
            ),
        ),
    ),
)
