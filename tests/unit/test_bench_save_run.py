"""`benchmarks/gpu_common.save_run`: a GPU benchmark's results file leads with the benchmark, the model and the
device it ran on, then the script's own fields, then the provenance block."""

from __future__ import annotations

import json

from benchmarks import gpu_common
from tokenspeed.bench_results import PROVENANCE_KEYS


def test_save_run_writes_benchmark_model_device_then_fields(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_common, "device_info", lambda: {"gpu": "NVIDIA H200", "sms": 132})
    out = tmp_path / "results" / "gpu_prefill.json"
    gpu_common.save_run(
        str(out), "prefill", "Llama-3.1-8B shape", matmul_peak_tflops=812.3, rows=[{"len": 1}]
    )

    data = json.loads(out.read_text())
    assert list(data)[:5] == ["benchmark", "model", "device", "matmul_peak_tflops", "rows"]
    assert data["benchmark"] == "prefill" and data["model"] == "Llama-3.1-8B shape"
    assert data["device"] == {"gpu": "NVIDIA H200", "sms": 132}
    assert data["matmul_peak_tflops"] == 812.3 and data["rows"] == [{"len": 1}]
    assert set(PROVENANCE_KEYS) <= set(data["provenance"])
