"""On the GPU: the dense GEMV of decode batches (`kernels/bf16_gemv.py`) on the Llama-3.1-8B shapes, every
configuration the autotuner may pick at M = 1..4, against the float32 reference; the autotuned entry point
and split-K replayed in a CUDA graph with new inputs; and a batch-1 decode step of the bf16 demo model that
runs it for every linear layer and the LM head (`--dense-gemv-backend triton`), with the logits of F.linear.

Written without a GPU at hand: the first device run is what checks these.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.gemv_timing import LLAMA_8B_LINEARS as SHAPES
from tests.gpu.kernel_launches import cuda_kernel_names
from tests.tiny_models import PagedHarness
from tokenspeed.demo_models import resolve_model_path
from tokenspeed.runtime.models.loader import load_model
from tokenspeed.runtime.models.model_config import ModelConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BF16_OUT = 5e-3  # the output's rounding to bf16 (2^-9 relative at most per element) and nothing more
FP32_OUT = 1e-4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_config_matches_float32_on_llama_shapes(shape):
    from tokenspeed.runtime.kernels import bf16_gemv

    n, k = SHAPES[shape]
    torch.manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    wf = w.float()
    worst = {}
    for m in (1, 2, 3, 4):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), wf)
        for cfg in bf16_gemv.candidates(bf16_gemv.m_bucket(m), True):
            got = bf16_gemv.dense_gemv(x, w, None, None, cfg)
            assert got.dtype == torch.bfloat16 and got.shape == (m, n)
            worst[(m, cfg)] = _rel(got, ref)
        for cfg in (bf16_gemv.CONFIGS[0], bf16_gemv.CONFIGS[-1]):  # float32 out (logits), split-K or not
            worst[(m, cfg, "fp32 out")] = _rel(bf16_gemv.dense_gemv(x, w, None, torch.float32, cfg), ref)
    del wf
    torch.cuda.empty_cache()
    for key, err in worst.items():
        print(f"bf16 gemv {shape} m={key[0]} {' '.join(map(str, key[1:]))}: rel err {err:.2e}")
    bad = {key: err for key, err in worst.items() if not err < (FP32_OUT if len(key) == 3 else BF16_OUT)}
    assert not bad, bad


@pytest.mark.parametrize("shape", ["down", "qkv"])
@pytest.mark.parametrize("m", [1, 4])
def test_autotuned_and_split_k_replay_in_a_cuda_graph(shape, m):
    """Tuned eagerly (as the runner's warm-up does), then captured: split-K merged by its last arrival and
    the tuned config's launch are device work only, a replay computes the new input's product, a split-K
    launch gives the same bits on every run whichever split arrives last, and its counts end at zero."""
    from tokenspeed.runtime.kernels import bf16_gemv

    n, k = SHAPES[shape]
    torch.manual_seed(m)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    split = next(c for c in bf16_gemv.CONFIGS if c.split_k == 4 and bf16_gemv.fits(c, bf16_gemv.m_bucket(m)))
    arrivals = torch.zeros(bf16_gemv.arrival_tiles(n, x.device), dtype=torch.int32, device="cuda")
    calls = {
        "autotuned": lambda: bf16_gemv.dense_gemv(x, w, bias, arrivals=arrivals),
        "split4": lambda: bf16_gemv.dense_gemv(x, w, bias, None, split, arrivals),
        "fp32_out": lambda: bf16_gemv.dense_gemv(x, w, None, torch.float32, arrivals=arrivals),
    }
    repeats = [calls["split4"]() for _ in range(20)]
    assert all(torch.equal(r, repeats[0]) for r in repeats[1:]) and int(arrivals.abs().sum()) == 0
    for fn in calls.values():
        fn()  # tunes outside the capture
    print(f"autotuned bf16 gemv {shape} m={m}: {bf16_gemv._tuned.best_config}")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        outs = {name: fn() for name, fn in calls.items()}
    for trial in range(2):  # a second replay starts from counts the first left at zero
        x.copy_(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref = F.linear(x.float(), w.float(), bias.float())
        errors = {
            name: _rel(out, ref if name != "fp32_out" else ref - bias.float()) for name, out in outs.items()
        }
        print(f"graph replay {trial} {shape} m={m}: {errors}")
        assert (
            errors["autotuned"] < BF16_OUT and errors["split4"] < BF16_OUT and errors["fp32_out"] < FP32_OUT
        )
        assert int(arrivals.abs().sum()) == 0


def test_bs1_decode_runs_the_gemv_for_every_dense_layer():
    from tokenspeed.runtime.layers.dense_gemv import apply_dense_gemv_backend
    from tokenspeed.runtime.layers.embedding import LMHead
    from tokenspeed.runtime.layers.linear import LinearBase

    path = str(resolve_model_path("demo"))
    cfg = ModelConfig.from_pretrained(path, dtype="bfloat16", device="cuda")
    model = load_model(cfg, device="cuda")
    prompt = [5, 300, 17, 42]

    def run(harness: PagedHarness) -> list[torch.Tensor]:
        return [harness.step([("r", prompt)])] + [harness.step([("r", [t])]) for t in (7, 8, 9)]

    plain = run(PagedHarness(model, cfg, backend="triton", device="cuda", num_pages=8))
    assert apply_dense_gemv_backend(model, "triton", "cuda") == "triton"
    dense = sum(isinstance(m, (LinearBase, LMHead)) for m in model.modules())
    harness = PagedHarness(model, cfg, backend="triton", device="cuda", num_pages=8)
    gemv = run(harness)  # prefill (4 rows) and decode steps: their configs are tuned here
    for a, b in zip(plain, gemv, strict=True):
        assert a.dtype == b.dtype == torch.float32
        assert F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item() > 0.999
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    names = cuda_kernel_names(lambda: harness.step([("r", [10])]))
    launches = sum("_dense_gemv_kernel" in name for name in names)
    print(f"bs1 decode step: {len(names)} kernels, {launches} dense GEMV launches for {dense} dense layers")
    assert dense > 0 and launches == dense, sorted(set(names))


@pytest.mark.parametrize("rows", [5, 16, 40, 64])
def test_a_table_sends_larger_batches_to_the_skinny_gemm(rows):
    """A tuned table's skinny entry (`kernels/gemv_table.py`): a dense layer at 5-64 rows runs the skinny
    tensor-core GEMM (one launch of it, K split and merged by arrival), as exact as cuBLAS's bf16 output,
    the same bits eager and replayed from a CUDA graph, its arrival counts back at zero; past the rows
    timed, cuBLAS."""
    from types import MappingProxyType

    from tokenspeed.runtime.kernels.gemv_table import DenseGemvTable, shape_key
    from tokenspeed.runtime.layers.dense_gemv import TritonGemv
    from tokenspeed.runtime.layers.linear import ReplicatedLinear

    cfg = dict(block_m=16, block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=4, swap_ab=True)
    cfg64 = dict(cfg, block_m=64, split_k=2, swap_ab=False)
    key = shape_key(4096, 4096, "bfloat16")
    table = DenseGemvTable(skinny=MappingProxyType({key: MappingProxyType({16: cfg, 64: cfg64})}))
    layer = ReplicatedLinear(4096, 4096, bias=False).to("cuda", torch.bfloat16)
    torch.manual_seed(rows)
    layer.weight.data.normal_(0, 0.02)
    quant = TritonGemv(table)
    layer.quant = quant
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x.float(), layer.weight.float())
    names = cuda_kernel_names(lambda: layer(x))
    assert sum("_skinny_gemm_kernel" in n for n in names) == 1, names
    eager = layer(x)
    assert _rel(eager, ref) < BF16_OUT
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager) and quant._arrivals.all_zero()
    wide = torch.randn(65, 4096, device="cuda", dtype=torch.bfloat16)  # more rows than any entry: cuBLAS
    assert not any("_skinny_gemm_kernel" in n for n in cuda_kernel_names(lambda: layer(wide)))
