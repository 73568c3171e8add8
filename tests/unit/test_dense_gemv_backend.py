"""`--dense-gemv-backend`: parsed, validated and carried to the model runner; resolved per device; the Triton
GEMV handed to every bf16/fp16 linear layer and LM head but not to FP8 layers; and on tensors it does not
take (the CPU here) the layers still compute exactly what F.linear does. The kernel itself is checked in
Triton's interpreter (tests/engine/test_bf16_gemv_interpreter.py) and on the GPU (tests/gpu/)."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import make_tiny_model
from tokenspeed.config.cli import build_parser, namespace_to_fields
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.slices import RunnerConfig
from tokenspeed.config.validate import check_inputs
from tokenspeed.runtime.layers.dense_gemv import (
    apply_dense_gemv_backend,
    resolve_dense_gemv_backend,
    use_dense_multiply,
)
from tokenspeed.runtime.layers.embedding import LMHead
from tokenspeed.runtime.layers.linear import UNQUANTIZED, LinearBase
from tokenspeed.runtime.layers.quantization.fp8 import Fp8Linear, quantize_model
from tokenspeed.runtime.models.loader import load_model
from tokenspeed.runtime.models.model_config import ModelConfig


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def test_flag_reaches_the_runner_and_bad_values_name_the_flag():
    fields = namespace_to_fields(build_parser().parse_args(["MODEL", "--dense-gemv-backend", "torch"]))
    assert fields["dense_gemv_backend"] == "torch"
    assert namespace_to_fields(build_parser().parse_args(["MODEL"]))["dense_gemv_backend"] == "auto"
    runner = RunnerConfig.from_server_args(ServerArgs(model="m", device="cpu", dense_gemv_backend="torch"))
    assert runner.dense_gemv_backend == "torch"
    with pytest.raises(
        ValueError, match="--dense-gemv-backend 'cublas' is not supported; choose one of auto"
    ):
        check_inputs(ServerArgs(model="m", dense_gemv_backend="cublas"))


def test_backend_resolution_per_device():
    assert resolve_dense_gemv_backend("auto", "cpu") == "torch"
    assert resolve_dense_gemv_backend(None, "cpu") == "torch"
    assert resolve_dense_gemv_backend("auto", "cuda") == "torch"  # until the H200 has measured the GEMV
    assert resolve_dense_gemv_backend("torch", "cuda") == "torch"
    with pytest.raises(
        ValueError, match="--dense-gemv-backend 'cutlass' is not available.*auto, torch, triton"
    ):
        resolve_dense_gemv_backend("cutlass", "cpu")
    with pytest.raises(ValueError, match="--dense-gemv-backend triton needs a CUDA GPU"):
        apply_dense_gemv_backend(torch.nn.Linear(2, 2), "triton", "cpu")


def test_triton_gemv_goes_to_dense_layers_only_and_keeps_results(tmp_path):
    pytest.importorskip("triton")
    from tokenspeed.runtime.layers.dense_gemv import TritonGemv

    path = make_tiny_model("llama", tmp_path)
    config = ModelConfig.from_pretrained(path, dtype="float32", device="cpu")
    model = load_model(config)
    # on the CPU `auto` changes nothing
    assert apply_dense_gemv_backend(model, "auto", "cpu") == "torch"
    assert all(m.quant is UNQUANTIZED for m in model.modules() if isinstance(m, (LinearBase, LMHead)))
    dense = [m for m in model.modules() if isinstance(m, LinearBase)]
    head = model.lm_head
    xs = [torch.randn(3, m.in_features) for m in dense] + [torch.randn(3, config.hidden_size)]
    before = [m(x) for m, x in zip([*dense, head], xs, strict=True)]

    gemv = TritonGemv()
    assert use_dense_multiply(model, gemv) == len(dense) + 1
    assert all(m.quant is gemv for m in dense) and head.quant is gemv
    after = [m(x) for m, x in zip([*dense, head], xs, strict=True)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # on CPU tensors: F.linear
    assert after[-1].dtype == torch.float32

    # FP8 layers keep their own GEMV; the LM head (kept in the model's dtype) still takes the dense one
    fp8 = load_model(config)
    quantize_model(fp8)
    assert use_dense_multiply(fp8, gemv) == 1 and fp8.lm_head.quant is gemv
    assert all(isinstance(m.quant, Fp8Linear) for m in fp8.modules() if isinstance(m, LinearBase))


def test_a_table_limits_the_triton_gemv_to_its_shapes_and_batches():
    # `auto` hands the GEMV the GPU's tuned table; `--dense-gemv-backend triton` none (every shape). On the
    # CPU nothing takes the GEMV at all; the table's verdict is what a CUDA tensor would get.
    pytest.importorskip("triton")
    from types import MappingProxyType

    from tokenspeed.runtime.kernels.gemv_table import DenseGemvTable, shape_key
    from tokenspeed.runtime.layers.dense_gemv import TritonGemv

    table = DenseGemvTable(MappingProxyType({shape_key(8, 16, torch.float32): 2}))
    gemv = TritonGemv(table)
    w = torch.randn(8, 16)
    assert not gemv._takes(torch.randn(1, 16), w)  # a CPU tensor: F.linear
    assert gemv.table.takes(8, 16, torch.float32, 2) and not gemv.table.takes(8, 16, torch.float32, 3)
    assert TritonGemv().table is None
