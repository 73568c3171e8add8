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
        # text chunks: at least one per request, never more than tokens
        assert 1.0 <= run["tokens_per_chunk"] <= 8.0


def test_unreachable_server_or_missing_key_is_a_clear_error(server, tmp_path, capsys):
    from tests.server.server_proc import free_port

    args = ["serving", "--num-prompts", "2", "--output", str(tmp_path / "x.json")]
    assert bench_main([*args, "--base-url", f"http://127.0.0.1:{free_port()}"]) == 2
    said = capsys.readouterr().out
    assert "cannot reach" in said and "--base-url" in said and "Traceback" not in said
    assert bench_main([*args, "--base-url", server.url]) == 2  # the session server wants its key
    assert "401" in capsys.readouterr().out and not (tmp_path / "x.json").exists()
