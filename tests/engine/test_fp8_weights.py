"""FP8 weights on the CPU: the quantize/dequantize arithmetic, FP8 checkpoints (block-wise, per-tensor,
per-channel compressed-tensors) against the float32 model of the weights they stand for, `--quantization
fp8` against the unquantized model, and the refusal of checkpoints this build cannot run.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from tests.fp8_models import make_fp8_pair
from tests.tiny_models import PagedHarness, make_tiny_model
from tokenspeed.demo_models import resolve_model_path
from tokenspeed.runtime.layers.quantization.fp8_math import (
    FP8_DTYPE,
    FP8_MAX,
    dequantize,
    quantize_block,
    quantize_per_channel,
)
from tokenspeed.runtime.models.loader import load_model
from tokenspeed.runtime.models.model_config import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _bound(w: torch.Tensor, scale_per_element: torch.Tensor) -> torch.Tensor:
    # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of the value; below 2^-6 (subnormals) a fixed
    # step of 2^-9 in units of the scale.
    return w.abs() * 2.0**-4 + scale_per_element * 2.0**-9 + 1e-7


@pytest.mark.parametrize("shape", [(64, 48), (200, 300), (3, 130, 257)])
def test_per_channel_round_trip(shape):
    torch.manual_seed(0)
    w = torch.randn(shape) * torch.rand(shape[:-1] + (1,)) * 3
    q, scale = quantize_per_channel(w)
    assert q.dtype == FP8_DTYPE and scale.shape == (*shape[:-1], 1) and scale.dtype == torch.float32
    # the largest value of each row lands on e4m3's largest finite value
    assert torch.allclose(q.float().abs().amax(dim=-1), torch.full(shape[:-1], FP8_MAX))
    deq = dequantize(q, scale, None, torch.float32)
    assert ((deq - w).abs() <= _bound(w, scale.expand(shape))).all()
    # quantizing what an FP8 weight stands for gives the same FP8 weight back
    q2, scale2 = quantize_per_channel(deq)
    assert torch.equal(q2.float(), q.float()) and torch.allclose(scale2, scale)


@pytest.mark.parametrize(
    "shape,block", [((256, 384), (128, 128)), ((200, 300), (128, 128)), ((2, 96, 40), (32, 16))]
)
def test_block_round_trip(shape, block):
    torch.manual_seed(1)
    w = torch.randn(shape)
    w[..., : block[0], : block[1]] *= 50  # one loud tile must not cost the others their precision
    q, scale = quantize_block(w, block)
    rows, cols = shape[-2:]
    assert scale.shape == (*shape[:-2], -(-rows // block[0]), -(-cols // block[1]))
    deq = dequantize(q, scale, block, torch.float32)
    per_element = scale.repeat_interleave(block[0], -2).repeat_interleave(block[1], -1)[..., :rows, :cols]
    assert ((deq - w).abs() <= _bound(w, per_element)).all()
    # a quiet tile keeps its own scale (~1/448 of its own max), not the loud tile's
    assert scale[..., -1, -1].max() < scale[..., 0, 0].min() / 10
    # the reference the layers compute with: float32 per element
    expected = q.float() * per_element
    assert torch.equal(deq, expected)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return {arch: make_tiny_model(arch, root) for arch in ("llama", "qwen3_moe")}


def _load(path: str, quantization: str | None = None):
    config = ModelConfig.from_pretrained(path, dtype="float32", device="cpu", quantization=quantization)
    return config, load_model(config)


def _greedy(model, config, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    h = PagedHarness(model, config, num_pages=24)
    logits = h.step([("r", prompt)])
    tokens, rows = [], [logits[0]]
    for _ in range(steps):
        tokens.append(int(logits[0].argmax()))
        logits = h.step([("r", [tokens[-1]])])
        rows.append(logits[0])
    return tokens, rows


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("layout", ["block", "tensor", "channel"])
def test_fp8_checkpoint_matches_its_dequantized_model(tiny, tmp_path, arch, layout):
    fp8_path, ref_path = make_fp8_pair(tiny[arch], tmp_path, layout)
    config, model = _load(fp8_path)
    assert config.weight_quant is not None and config.weight_quant.source == "checkpoint"
    assert config.weight_quant.block == ((16, 16) if layout == "block" else None)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.dtype == FP8_DTYPE and attn.o_proj.weight.dtype == FP8_DTYPE
    mlp = model.model.layers[0].mlp
    if arch == "qwen3_moe":
        assert mlp.experts.w13.dtype == FP8_DTYPE and mlp.experts.w2.dtype == FP8_DTYPE
        assert mlp.gate.weight.dtype == torch.float32  # the router stays as the checkpoint has it
    else:
        assert mlp.gate_up_proj.weight.dtype == FP8_DTYPE
    assert model.lm_head.weight.dtype == torch.float32
    # one byte per weight of every quantized layer
    fp8_bytes = sum(p.numel() for p in model.parameters() if p.dtype == FP8_DTYPE)
    assert fp8_bytes > 0.5 * sum(p.numel() for n, p in model.named_parameters() if "layers." in n)

    ref_config, ref = _load(ref_path)
    prompt = [5, 17, 42, 9, 77, 120]
    tokens, rows = _greedy(model, config, prompt, 32)
    ref_tokens, ref_rows = _greedy(ref, ref_config, prompt, 32)
    assert tokens == ref_tokens
    cos = [F.cosine_similarity(a, b, dim=0).item() for a, b in zip(rows, ref_rows, strict=True)]
    assert min(cos) >= 0.999, cos


def test_online_fp8_agrees_with_the_unquantized_model():
    """--quantization fp8 on the trained demo models, teacher-forced along the float32 model's greedy
    path: top-1 agreement per step and logits cosine (measured: 247/256 steps on both, cosine >= 0.987)."""
    for name in ("demo", "demo-moe"):
        path = str(resolve_model_path(name))
        config, ref = _load(path)
        qconfig, model = _load(path, "fp8")
        assert qconfig.weight_quant is not None and qconfig.weight_quant.source == "online"
        assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == FP8_DTYPE
        h_ref, h = PagedHarness(ref, config, num_pages=24), PagedHarness(model, qconfig, num_pages=24)
        prompt = [5, 300, 17, 42, 1000, 77]
        a, b = h_ref.step([("r", prompt)]), h.step([("r", prompt)])
        steps = 256 if name == "demo" else 48
        agree, cos = 0, []
        for _ in range(steps):
            token = int(a[0].argmax())
            agree += token == int(b[0].argmax())
            cos.append(F.cosine_similarity(a[0], b[0], dim=0).item())
            a, b = h_ref.step([("r", [token])]), h.step([("r", [token])])
        assert agree >= 0.93 * steps, (name, agree, steps)
        assert sum(cos) / len(cos) >= 0.995 and min(cos) >= 0.95, (name, min(cos))


@pytest.mark.parametrize(
    "quant_config,named",
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "awq"),
        ({"quant_method": "gptq", "bits": 4, "desc_act": False}, "gptq"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt NVFP4"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ],
)
def test_unrunnable_quantized_checkpoint_is_refused_by_name(tiny, tmp_path, quant_config, named):
    path = tmp_path / "quantized"
    shutil.copytree(tiny["llama"], path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = quant_config
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        ModelConfig.from_pretrained(str(path), device="cpu")
    message = str(err.value)
    assert f"is quantized with {named}" in message and "supported: FP8 checkpoints" in message
    assert "does not have" not in message


def test_quantization_flag_must_match_the_checkpoint(tiny, tmp_path):
    with pytest.raises(ValueError, match="--quantization compressed-tensors: model .* is not a"):
        ModelConfig.from_pretrained(tiny["llama"], device="cpu", quantization="compressed-tensors")
    fp8_path, _ = make_fp8_pair(tiny["llama"], tmp_path, "block")
    with pytest.raises(ValueError, match="--quantization compressed-tensors does not match"):
        ModelConfig.from_pretrained(fp8_path, device="cpu", quantization="compressed-tensors")
    assert ModelConfig.from_pretrained(fp8_path, device="cpu", quantization="fp8").weight_quant.block == (
        16,
        16,
    )
