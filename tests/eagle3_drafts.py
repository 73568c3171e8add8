"""Random EAGLE3 drafts for the tiny test models, written in the Hugging Face layout drafts are published
in (config.json + model.safetensors), without transformers: fixed seed, small init so the draft's outputs
stay finite, and a draft vocabulary smaller than the target's (with its `d2t` map) unless asked otherwise.

`echo=True` makes a draft that reads the target's own last-layer state through the target's norm and LM
head (attention and MLP outputs zeroed): it proposes the token the target just emitted, again and again,
so its drafts are accepted wherever the target repeats a token (random tiny models often do)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def make_tiny_eagle3_draft(
    target: str | os.PathLike,
    out: str | os.PathLike,
    seed: int = 0,
    draft_vocab_size: int | None = 64,
    aux_layer_ids: list[int] | None = None,
    with_embedding: bool = False,
    echo: bool = False,
) -> str:
    tcfg = json.loads((Path(target) / "config.json").read_text())
    h, vocab = tcfg["hidden_size"], tcfg["vocab_size"]
    heads = tcfg["num_attention_heads"]
    kv_heads = tcfg.get("num_key_value_heads", heads)
    head_dim = tcfg.get("head_dim") or h // heads
    inter = tcfg["intermediate_size"]
    dv = draft_vocab_size or vocab
    n_aux = len(aux_layer_ids) if aux_layer_ids else 3
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    tensors = {
        "fc.weight": rand(h, n_aux * h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, heads * head_dim),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "norm.weight": torch.ones(h),
        "lm_head.weight": rand(dv, h) * 20,
    }
    if echo:
        from safetensors.torch import load_file

        target_w = load_file(str(Path(target) / "model.safetensors"))
        n_layers = tcfg["num_hidden_layers"]
        aux_layer_ids, n_aux, dv = [n_layers - 1, 0, 0], 3, vocab
        tensors["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, 2 * h)], dim=1)
        tensors["midlayer.self_attn.o_proj.weight"] = torch.zeros(h, heads * head_dim)
        tensors["midlayer.mlp.down_proj.weight"] = torch.zeros(h, inter)
        tensors["norm.weight"] = target_w["model.norm.weight"].float()
        head = target_w.get("lm_head.weight", target_w["model.embed_tokens.weight"])
        tensors["lm_head.weight"] = head.float()
    if dv < vocab:
        # the draft predicts every other target id from 5 on: draft id i -> target id 5 + 2 i
        ids = (5 + 2 * torch.arange(dv)).clamp(max=vocab - 1)
        tensors["d2t"] = ids - torch.arange(dv)
    if with_embedding:
        tensors["embed_tokens.weight"] = rand(vocab, h)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "rms_norm_eps": tcfg.get("rms_norm_eps", 1e-6),
        "rope_theta": tcfg.get("rope_theta", 10000.0),
        "max_position_embeddings": tcfg.get("max_position_embeddings", 2048),
        "vocab_size": vocab,
        "draft_vocab_size": dv,
    }
    if aux_layer_ids:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layer_ids}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(out)
