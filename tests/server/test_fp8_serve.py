"""A real `tokenspeed serve --quantization fp8 --kv-cache-dtype fp8_e4m3`: FP8 weights quantized at load, an
FP8 KV cache sized at one byte an element, a completion answered over HTTP, and the pool size in /metrics.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_proc import module_server
from tokenspeed.demo_models import resolve_model_path

# The demo model: 4 layers x 2 KV heads x 64 dims, K and V: 1024 bytes a token in FP8 (bf16: 2048,
# float32 4096). 0.0005 GiB holds 8 pages of 64 tokens in FP8, 4 in bf16, 2 in float32.
BUDGET_GB = 0.0005
FP8_BYTES_PER_TOKEN = 2 * 4 * 2 * 64
PAGE = 64


server = module_server(
    "demo", "fp8-serve",
    "--quantization", "fp8",
    "--kv-cache-dtype", "fp8_e4m3",
    "--cpu-kv-cache-memory-gb", str(BUDGET_GB),
    "--enable-metrics",
)  # fmt: skip


def test_fp8_server_answers_and_sizes_its_kv_cache_in_bytes_of_fp8(server):
    r = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": "demo", "prompt": "To open a file,", "max_tokens": 16, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"].strip() and choice["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 16

    budget = int(BUDGET_GB * (1 << 30))
    fp8_tokens = budget // (FP8_BYTES_PER_TOKEN * PAGE) * PAGE
    bf16_tokens = budget // (2 * FP8_BYTES_PER_TOKEN * PAGE) * PAGE
    metrics = {}
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=10).text):
        for sample in family.samples:
            metrics[sample.name] = sample.value
    assert metrics["tokenspeed:kv_cache_total_tokens"] == fp8_tokens == 2 * bf16_tokens == 512
    log = server.log()
    assert "layers quantized to FP8 e4m3 per channel" in log
    assert "KV cache: FP8 e4m3 with K/V scales 1.0" in log
    info = server.server_info()
    assert info["kv_cache_dtype"] == "fp8_e4m3" and info["quantization"] == "fp8"


def test_serve_refuses_an_awq_checkpoint_by_name_before_starting_ranks(tmp_path):
    model = tmp_path / "demo-awq"
    shutil.copytree(resolve_model_path("demo"), model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    (model / "config.json").write_text(json.dumps(config))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tokenspeed", "serve", str(model), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "is quantized with awq" in proc.stderr and "supported: FP8 checkpoints" in proc.stderr
    assert "Traceback" not in proc.stderr and "scheduler" not in proc.stderr
    # no rank process was started: measured ~4 s idle, mostly imports; generous for a loaded CI machine
    assert time.monotonic() - started < 60
