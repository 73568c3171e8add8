"""The probe and the planner, on recorded GPU readings; the NVML path itself in a `gpu` test."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from console.probe import GpuReading, Probe, load_probe, probe_gpus
from console.profile.fleet import load_and_resolve
from console.profile.plan import GIB, check_fits, plan_with_platform
from tests.console.conftest import tokenspeed
from tokenspeed.config import memory_model

DATA = Path(__file__).resolve().parent / "data"
SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"  # the models' config.json files
PROFILES = Path(__file__).resolve().parents[2] / "profiles"
LLAMA_8B = json.loads((SHAPES / "llama-3.1-8b.json").read_text())
QWEN3_MOE = json.loads((SHAPES / "qwen3-30b-a3b.json").read_text())
H200 = DATA / "h200x8-idle.json"


def h200(free_mib: float = 143194.0, count: int = 8) -> Probe:
    gpus = tuple(
        GpuReading(i, "NVIDIA H200", 143771.0, free_mib, 143771.0 - free_mib, (9, 0)) for i in range(count)
    )
    return Probe("nvidia", "h200-node", gpus)


def profile(tmp_path: Path, server: str, fleet: str = "") -> Path:
    path = tmp_path / "p.toml"
    path.write_text(textwrap.dedent(f'[server]\nmodel = "m"\n{server}\n[fleet]\nname = "p"\n{fleet}\n'))
    return path


def test_recorded_reading_loads_as_a_probe():
    probe = load_probe(H200)
    assert probe.kind == "nvidia" and len(probe.gpus) == 8
    assert probe.gpus[0].total_mib == 143771.0 and probe.gpus[0].compute_capability == (9, 0)


def test_llama_8b_on_one_h200():
    plan = plan_with_platform(
        load_and_resolve(PROFILES / "llama-3.1-8b-h200.toml"), load_probe(H200), LLAMA_8B
    )
    assert plan.fits, plan.reason
    (server,) = plan.servers
    assert server.gpus == [0] and server.gpu_name == "NVIDIA H200"
    assert server.total_gib == pytest.approx(143771 / 1024)
    # The seed's default for world size 1, untouched: the GPU is idle.
    assert server.gpu_memory_utilization == server.utilization_default == 0.88
    # 8.03 B parameters in bfloat16, and the 32 MiB rotary table of 32768 positions.
    assert (8.03e9 * 2 + 32 * 2**20) / GIB == pytest.approx(server.weights_gib, rel=1e-3)
    # K and V x 32 layers x 8 KV heads x 128 dims x 2 bytes.
    assert server.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    # What is left of the free memory once weights, reserve and the 12% kept away are taken.
    left = server.free_gib - server.weights_gib - server.reserve_gib - server.total_gib * 0.12
    assert server.kv_gib == pytest.approx(left, abs=server.kv_bytes_per_token * 64 / GIB)
    assert server.max_model_len == 32768 and server.concurrent_seqs == server.kv_tokens // 32768
    # The server of this profile reported max_total_tokens=874688 on an H200 (issue 14).
    assert server.kv_tokens == pytest.approx(874688, rel=0.01) and server.concurrent_seqs == 26
    # Large GPU, no speculative decoding: the seed captures up to 160.
    assert server.max_cudagraph_capture_size == 160
    assert server.cudagraph_capture_sizes == memory_model.capture_sizes(None, 160, 160)
    assert (
        server.cudagraph_capture_sizes[:5] == [1, 2, 4, 8, 16] and server.cudagraph_capture_sizes[-1] == 160
    )


def test_memory_held_by_others_comes_out_of_the_kv_cache(tmp_path):
    resolved = load_and_resolve(profile(tmp_path, "max_model_len = 8192", "gpus = [0]"))
    busy = h200(free_mib=60_000)
    plan = plan_with_platform(resolved, busy, LLAMA_8B)
    server = plan.servers[0]
    assert plan.fits
    # The fraction stays the seed's: what others hold is simply not free for the KV cache.
    assert server.gpu_memory_utilization == server.utilization_default == 0.88
    idle = plan_with_platform(resolved, h200(), LLAMA_8B).servers[0]
    taken = (143194 - 60_000) * 2**20 // server.kv_bytes_per_token
    assert idle.kv_tokens - server.kv_tokens == pytest.approx(taken, abs=64)
    assert any("GiB held by other processes" in note for note in server.notes)


def test_small_gpu_gets_small_graphs_and_a_refusal_for_long_context(tmp_path):
    small = Probe("nvidia", "l4", (GpuReading(0, "NVIDIA L4", 23034.0, 22500.0, 0.0, (8, 9)),))
    resolved = load_and_resolve(profile(tmp_path, "max_model_len = 32768", "gpus = [0]"))
    plan = plan_with_platform(resolved, small, LLAMA_8B)
    server = plan.servers[0]
    # The seed: under 25 000 MiB and world size < 4, capture at most 8.
    assert server.max_cudagraph_capture_size == 8 and server.cudagraph_capture_sizes == [1, 2, 4, 8]
    assert not plan.fits
    assert "less than one sequence of max_model_len 32768" in plan.reason


def test_model_too_large_is_refused_with_the_numbers(tmp_path):
    big = dict(
        LLAMA_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64
    )
    resolved = load_and_resolve(profile(tmp_path, "", "gpus = [0]"))
    plan = plan_with_platform(resolved, h200(), big)
    assert not plan.fits
    assert "p-0: weights 131." in plan.reason and "exceed" in plan.reason and "more GPUs" in plan.reason


def test_expert_parallel_moe_on_eight_h200():
    plan = plan_with_platform(load_and_resolve(PROFILES / "qwen3-30b-a3b-ep8.toml"), h200(), QWEN3_MOE)
    server = plan.servers[0]
    assert plan.fits and server.gpus == list(range(8))
    assert server.utilization_default == 0.81  # the seed's default for world size 8
    # Attention is data parallel (TP 1), and the server splits experts only inside an attention TP group:
    # every GPU holds all 30.5 B parameters (what tests/console/test_plan_agrees.py checks on the model).
    assert 56.5 < server.weights_gib < 57.5
    assert server.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert server.concurrent_seqs == (server.kv_tokens // 32768) * 8


def test_gpus_that_do_not_exist_are_refused(tmp_path):
    resolved = load_and_resolve(profile(tmp_path, "attn_tp_size = 8", "gpus = [0, 1, 2, 3, 4, 5, 6, 7]"))
    plan = plan_with_platform(resolved, h200(count=4), LLAMA_8B)
    assert not plan.fits and "GPU(s) [4, 5, 6, 7] not found" in plan.reason


def test_cpu_machine_plans_cpu_and_refuses_cuda(tmp_path):
    cpu = Probe("cpu", "laptop", note="NVML unavailable")
    on_cpu = load_and_resolve(profile(tmp_path, 'device = "cpu"'))
    assert check_fits(on_cpu, cpu) is None
    on_gpu = load_and_resolve(profile(tmp_path, ""))
    reason = check_fits(on_gpu, cpu)
    assert "no NVIDIA GPU on laptop" in reason and 'device = "cpu"' in reason


@pytest.mark.skipif(probe_gpus().kind == "nvidia", reason="this machine has a GPU")
def test_up_refuses_a_gpu_profile_on_a_cpu_machine_and_starts_nothing(tmp_path):
    # a model the pre-flight finds (a local folder with its config), so what stops `up` is the plan
    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text((SHAPES / "llama-3.1-8b.json").read_text())
    path = profile(tmp_path, "", "base_port = 26000")
    path.write_text(path.read_text().replace('model = "m"', f'model = "{model}"'))
    state = tmp_path / "state"
    result = tokenspeed("up", "-d", str(path), "--state-dir", str(state))
    assert result.returncode == 2
    assert "the plan does not fit" in result.stderr and "nothing was started" in result.stderr
    assert not state.exists()


def test_cli_plan_against_recorded_readings():
    args = ["profile", "plan", str(PROFILES / "llama-3.1-8b-h200.toml"), "--gpus-from", str(H200)]
    result = tokenspeed(*args, "--model-config", str(SHAPES / "llama-3.1-8b.json"))
    assert result.returncode == 0, result.stderr
    assert "NVIDIA H200" in result.stdout and "gpu_memory_utilization 0.88" in result.stdout
    assert "26 sequences at max_model_len 32768" in result.stdout
    as_json = json.loads(tokenspeed(*args, "--json").stdout)
    assert as_json["fits"] and as_json["servers"][0]["gpus"] == [0]


@pytest.mark.gpu
def test_nvml_probe_reads_the_real_gpus():
    import pynvml

    probe = probe_gpus()
    assert probe.kind == "nvidia" and probe.gpus
    pynvml.nvmlInit()
    assert len(probe.gpus) == pynvml.nvmlDeviceGetCount()
    for gpu in probe.gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
        assert gpu.total_mib == pytest.approx(total)
        assert 0 <= gpu.free_mib <= gpu.total_mib
        assert gpu.compute_capability == tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
    # A recorded probe plans exactly like a live one.
    assert Probe.from_dict(json.loads(json.dumps(probe.to_dict()))) == probe
