"""The EAGLE3 draft model, read from the Hugging Face layout EAGLE3 drafts are published in.

config.json: `architectures: ["LlamaForCausalLMEagle3"]`, Llama fields, `num_hidden_layers: 1`,
`vocab_size` (the target's), `draft_vocab_size`, optional `eagle_config.eagle_aux_hidden_state_layer_ids`.
Weights: `fc` [H, n*H], one `midlayer` decoder layer whose attention reads 2H (the normed token embedding
next to the normed hidden state), `norm`, `lm_head` [draft_vocab, H], optional `d2t` (target id = draft id
+ d2t[draft id]) and `embed_tokens` (absent: the target's input embedding is shared).

One draft position t reads the token at t+1 and a hidden state standing for t: `fc(captured target states
of t)` when the target computed t, else the draft's own pre-norm output at t-1 (chain steps). Its K/V go to
a one-layer paged pool that shares the target's page table, so draft and target KV are allocated, shared
through the prefix cache and freed together.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from tokenspeed.runtime.layers.attention import PagedAttention
from tokenspeed.runtime.layers.rotary import RotaryEmbedding, rope_parameters

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


@dataclass(frozen=True)
class DraftConfig:
    path: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int
    max_position: int
    rope: dict
    aux_layer_ids: tuple[int, ...] | None  # the config's; None: the caller's default

    @classmethod
    def read(cls, path: str) -> DraftConfig:
        file = os.path.join(path, "config.json")
        with open(file) as f:
            cfg = json.load(f)
        archs = cfg.get("architectures") or []
        if not any(a in ARCHITECTURES for a in archs):
            raise ValueError(
                f"--speculative-draft-model-path {path}: config.json architectures {archs} is not an EAGLE3 "
                f"draft ({ARCHITECTURES[0]})"
            )
        if cfg.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"--speculative-draft-model-path {path}: an EAGLE3 draft has one layer")
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return cls(
            path=path,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or hidden // heads,
            intermediate_size=cfg["intermediate_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            vocab_size=cfg["vocab_size"],
            draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
            max_position=cfg.get("max_position_embeddings", 2048),
            rope=rope_parameters(SimpleNamespace(**cfg)),
            aux_layer_ids=tuple(ids) if ids else None,
        )


def default_aux_layers(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE3's default: after an early, a middle and a late layer of the target."""
    n = num_target_layers
    return tuple(max(i, 0) for i in (1, n // 2 - 1, n - 4))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig, num_aux: int, max_position: int):
        super().__init__()
        self.cfg = cfg
        h, i = cfg.hidden_size, cfg.intermediate_size
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim

        def weight(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape), requires_grad=False)

        self.weights = nn.ParameterDict(
            {
                "fc": weight(h, num_aux * h),
                "input_layernorm": weight(h),
                "hidden_norm": weight(h),
                "q_proj": weight(q, 2 * h),
                "k_proj": weight(kv, 2 * h),
                "v_proj": weight(kv, 2 * h),
                "o_proj": weight(h, q),
                "post_attention_layernorm": weight(h),
                "gate_proj": weight(i, h),
                "up_proj": weight(i, h),
                "down_proj": weight(h, i),
                "norm": weight(h),
                "lm_head": weight(cfg.draft_vocab_size, h),
            }
        )
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.embed: nn.Module | None = None  # set by load(): its own, or the target's
        self.attn = PagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim**-0.5, 0)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope)

    # checkpoint name -> our weight
    _NAMES = {
        "fc.weight": "fc",
        "midlayer.input_layernorm.weight": "input_layernorm",
        "midlayer.hidden_norm.weight": "hidden_norm",
        "midlayer.self_attn.q_proj.weight": "q_proj",
        "midlayer.self_attn.k_proj.weight": "k_proj",
        "midlayer.self_attn.v_proj.weight": "v_proj",
        "midlayer.self_attn.o_proj.weight": "o_proj",
        "midlayer.post_attention_layernorm.weight": "post_attention_layernorm",
        "midlayer.mlp.gate_proj.weight": "gate_proj",
        "midlayer.mlp.up_proj.weight": "up_proj",
        "midlayer.mlp.down_proj.weight": "down_proj",
        "norm.weight": "norm",
        "lm_head.weight": "lm_head",
    }

    @classmethod
    def load(
        cls, cfg: DraftConfig, num_aux: int, target_embed: nn.Module, dtype: torch.dtype, device: torch.device,
        max_position: int,
    ) -> Eagle3Draft:  # fmt: skip
        from safetensors.torch import load_file

        files = sorted(f for f in os.listdir(cfg.path) if f.endswith(".safetensors"))
        if not files:
            raise ValueError(f"--speculative-draft-model-path {cfg.path}: no *.safetensors weights")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(os.path.join(cfg.path, f)))
        model = cls(cfg, num_aux, max_position)
        missing = [n for n in cls._NAMES if n not in state]
        if missing:
            raise ValueError(f"--speculative-draft-model-path {cfg.path}: missing weights {missing}")
        for name, ours in cls._NAMES.items():
            param = model.weights[ours]
            if tuple(state[name].shape) != tuple(param.shape):
                raise ValueError(
                    f"--speculative-draft-model-path {cfg.path}: {name} has shape {tuple(state[name].shape)}, "
                    f"expected {tuple(param.shape)} (does the draft belong to this target and its "
                    f"{num_aux} captured layers?)"
                )
            param.data = state[name].to(dtype)
        if "d2t" in state:
            model.d2t = state["d2t"].to(torch.int64)
        model.to(device)
        model.rotary.init_buffers()
        if "embed_tokens.weight" in state:
            embed = nn.Embedding.from_pretrained(state["embed_tokens.weight"].to(dtype=dtype, device=device))
            model.embed = embed
        else:
            model.embed = target_embed
        return model.eval()

    def forward(
        self, fb: ForwardBatch, hidden: torch.Tensor, from_target: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(pre-norm outputs [T, H] of every position, float32 logits [len(logits_indices), draft vocab]).

        hidden: the captured target states [T, n*H] (`from_target`) or the draft's own outputs [T, H]."""
        w, eps = self.weights, self.cfg.rms_norm_eps
        if from_target:
            hidden = self.project(hidden)
        emb = self.embed(fb.input_ids).to(hidden.dtype)
        x = torch.cat([_rms(emb, w["input_layernorm"], eps), _rms(hidden, w["hidden_norm"], eps)], dim=-1)
        q, k, v = F.linear(x, w["q_proj"]), F.linear(x, w["k_proj"]), F.linear(x, w["v_proj"])
        cos_sin = self.rotary.cos_sin(fb.positions, x.dtype)
        out = self.attn(q, k, v, fb, cos_sin=cos_sin)
        h = F.linear(out, w["o_proj"]) + hidden
        m = _rms(h, w["post_attention_layernorm"], eps)
        h = h + F.linear(F.silu(F.linear(m, w["gate_proj"])) * F.linear(m, w["up_proj"]), w["down_proj"])
        logits = F.linear(_rms(h[fb.logits_indices], w["norm"], eps), w["lm_head"]).float()
        return h, logits

    def project(self, captured: torch.Tensor) -> torch.Tensor:
        """The captured target states [T, n*H] -> the hidden state [T, H] the draft layer reads."""
        return F.linear(captured, self.weights["fc"])

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
