"""`tokenspeed bench serving` against the session server: it runs, counts tokens right, writes its JSON."""

from __future__ import annotations

import json

from tests.server.conftest import API_KEY
from tokenspeed.bench import main as bench_main


def test_serving_benchmark_sweeps_and_reports(server, tmp_path):
    out = tmp_path / "serving.json"
    code = bench_main(
        [
            "serving", "--base-url", server.url, "--api-key", API_KEY, "--num-prompts", "6",
            "--input-len", "40", "--output-len", "8", "--shared-prefix-len", "16",
            "--max-concurrency", "1,3", "--warmup-requests", "1", "--output", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert [r["max_concurrency"] for r in result["runs"]] == [1, 3]
    for run in result["runs"]:
        assert run["completed"] == 6 and run["failed"] == 0
        assert run["total_output_tokens"] == 6 * 8
        assert run["ttft"]["p50_ms"] > 0 and run["itl"]["p99_ms"] >= run["itl"]["p50_ms"]
        assert run["output_token_throughput"] > 0
