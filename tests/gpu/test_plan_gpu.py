"""On the GPU: the console's plan is what the server runs with. A profile of a Llama-3.1-8B-shaped model
(dummy bf16 weights, a small tokenizer) is planned, started with `tokenspeed up -d`, and the server's
/get_server_info reports the plan's KV tokens (within 1%), memory fraction and CUDA-graph sizes; the
supervisor's GPU view names the server's memory as the fleet's own; `tokenspeed down` stops it.

    python3 -m pytest -m gpu -q -s tests/gpu/test_plan_gpu.py     (prints the planned and served figures)
"""

from __future__ import annotations

import json
import os
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.server.server_proc import free_port, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

START_TIMEOUT_S = 600


def _model(path: Path) -> Path:
    """A Llama-3.1-8B config.json and the tests' small tokenizer (weights: --load-format dummy)."""
    from benchmarks.gpu_common import LLAMA_8B
    from tests.tiny_models import save_tiny_tokenizer

    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA_8B))
    save_tiny_tokenizer(path)
    return path


def test_server_runs_the_plan_and_the_gpu_view_knows_it(tmp_path):
    model = _model(tmp_path / "llama-3.1-8b-dummy")
    name = f"plangpu{os.getpid()}"
    profile = tmp_path / "plan-gpu.toml"
    profile.write_text(
        textwrap.dedent(f"""\
            [server]
            model = "{model}"
            load_format = "dummy"
            dtype = "bfloat16"
            max_model_len = 32768

            [fleet]
            name = "{name}"
            gpus = [0]
            base_port = {free_port()}
            restart = "no"
            startup_timeout_s = {START_TIMEOUT_S}
            stop_timeout_s = 30
            """)
    )
    state = tmp_path / "state"
    result = run_cli("profile", "plan", str(profile), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads(result.stdout)["servers"][0]
    print(
        f"\nplan: {json.dumps({k: plan[k] for k in ('kv_tokens', 'free_gib', 'weights_gib', 'reserve_gib')})}"
    )
    try:
        result = run_cli("up", "-d", str(profile), "--state-dir", str(state), timeout=START_TIMEOUT_S + 60)
        assert result.returncode == 0, result.stdout + result.stderr
        from console.client import SupervisorClient

        with SupervisorClient(state) as client:
            (server,) = client.fleet()["servers"]
            with urllib.request.urlopen(server["url"] + "/get_server_info", timeout=30) as response:
                info = json.loads(response.read())
            served = info["max_total_num_tokens"]
            print(
                f"served: max_total_num_tokens {served} (plan {plan['kv_tokens']}, {served / plan['kv_tokens'] - 1:+.2%})"
            )
            assert served == pytest.approx(plan["kv_tokens"], rel=0.01)
            assert info["gpu_memory_utilization"] == plan["gpu_memory_utilization"]
            assert info["cudagraph_capture_sizes"] == plan["cudagraph_capture_sizes"]
            assert server["plan"]["kv_tokens"] == plan["kv_tokens"]

            # NVML's processes on GPU 0 include the server's scheduler: the view names it as the fleet's.
            deadline = time.monotonic() + 30
            while True:
                view = client.probe()
                owners = next(o for o in view["owners"] if o["index"] == 0)
                if owners["own"] or time.monotonic() > deadline:
                    break
                time.sleep(1)
            print(f"GPU 0 owners: {json.dumps(owners)}; plan: {view['plan']['verdict']}")
            assert set(owners["own"]) == {server["name"]}
            assert owners["own"][server["name"]] > 15 * 1024  # weights and KV cache, in MiB
            assert view["plan"]["verdict"] == "fits as running"
            # Its own memory counted free, a restart now plans what it runs with.
            assert view["plan"]["servers"][0]["kv_tokens"] == pytest.approx(plan["kv_tokens"], rel=0.01)
    finally:
        down = run_cli("down", "--state-dir", str(state), "--timeout", "60", timeout=120)
        assert down.returncode in (0, 3), down.stderr
