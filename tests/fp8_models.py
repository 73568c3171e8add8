"""FP8 versions of the tiny test models: the same random weights, written in an FP8 checkpoint layout,
next to a float32 folder of exactly the weights the FP8 one stands for (its dequantized twin).

Layouts: `block` (quant_method fp8, weight_block_size, `weight_scale_inv` per tile, the Qwen3-FP8 and
DeepSeek FP8 releases), `tensor` (quant_method fp8 without blocks, one `weight_scale` per tensor) and
`channel` (compressed-tensors float8, `weight_scale` [out, 1]). The MoE router, embeddings, norms and
the LM head stay in float32, as in real releases.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tokenspeed.runtime.layers.quantization.fp8_math import (
    FP8_MAX,
    dequantize,
    quantize_block,
    quantize_per_channel,
    to_fp8,
)

_QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize(w: torch.Tensor, layout: str, block: tuple[int, int]):
    if layout == "block":
        q, s = quantize_block(w, block)
        return q, s, dequantize(q, s, block, torch.float32)
    if layout == "tensor":
        s = (w.abs().max().float() / FP8_MAX).reshape(())
        q = to_fp8(w, s)
        return q, s, q.float() * s
    q, s = quantize_per_channel(w)
    return q, s, dequantize(q, s, None, torch.float32)


def _quant_config(layout: str, block: tuple[int, int]) -> dict:
    if layout == "block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    if layout == "tensor":
        return {"quant_method": "fp8", "activation_scheme": "static"}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }


def make_fp8_pair(
    path: str,
    out: str | Path,
    layout: str,
    block: tuple[int, int] = (16, 16),
    kv_scales: dict[int, tuple[float, float]] | None = None,
) -> tuple[str, str]:
    """(FP8 folder, float32 folder of the dequantized weights) made under `out` from the tiny float32
    model at `path`. `kv_scales` {layer: (k_scale, v_scale)} adds `self_attn.k_scale` / `v_scale`
    tensors to the FP8 one."""
    src = Path(path)
    fp8_dir, ref_dir = Path(out) / f"{src.name}-fp8-{layout}", Path(out) / f"{src.name}-fp8-{layout}-ref"
    for folder in (fp8_dir, ref_dir):
        shutil.copytree(src, folder)
        for f in folder.glob("*.safetensors"):
            f.unlink()
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    fp8_tensors, ref_tensors = {}, {}
    for name, w in tensors.items():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in _QUANTIZED and parts[-1] == "weight":
            q, s, deq = _quantize(w, layout, block)
            prefix = name[: -len(".weight")]
            fp8_tensors[name] = q
            fp8_tensors[prefix + (".weight_scale_inv" if layout == "block" else ".weight_scale")] = s
            if layout == "tensor":
                fp8_tensors[prefix + ".input_scale"] = torch.tensor(0.05)
            ref_tensors[name] = deq
        else:
            fp8_tensors[name] = w
            ref_tensors[name] = w
    for layer, (k, v) in (kv_scales or {}).items():
        fp8_tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k)
        fp8_tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v)
    save_file(fp8_tensors, str(fp8_dir / "model.safetensors"))
    save_file(ref_tensors, str(ref_dir / "model.safetensors"))
    config = json.loads((fp8_dir / "config.json").read_text())
    config["quantization_config"] = _quant_config(layout, block)
    (fp8_dir / "config.json").write_text(json.dumps(config, indent=2))
    return str(fp8_dir), str(ref_dir)
