"""A self-contained reference of the EAGLE3 draft model, in the Hugging Face layout drafts are published in.

The draft is one Llama decoder layer whose input is twice the hidden size: the (normed) embedding of a
token next to the (normed) hidden state that stands for the position before it. At the first draft step
that hidden state is `fc(cat(target states after the captured layers))`; at later steps it is the draft's
own pre-norm output of the previous step. Logits are over the draft vocabulary; `d2t` maps a draft id to a
target id (target = draft + d2t[draft]).

`unroll` runs EAGLE3's training-time test over full sequences: step 0 at every position t reads the target
states of t and the token at t+1; step k reads the draft's step k-1 output at the same array position and
the token at t+k+1, so it sits at position t+k and predicts the token at t+k+2. Attention follows what the
draft sees while serving a chain from root t: its step-0 keys of positions <= t (the prefix is always
re-encoded from the target's states after verification) plus the chain's own keys of steps 1..k. With the
sequence's true tokens as inputs this gives, for every root at once, exactly the chain a server drafts while
its drafts keep matching, which is all acceptance depends on. Nothing here imports the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class DraftShape:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512

    # Every field but aux_layer_ids is a config.json key of the same name, in the draft's file and in its
    # target's: the three below read and write them by name.
    def config_json(self, eos_token_id: int) -> dict:
        shape = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "aux_layer_ids"}
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_act": "silu",
            **shape,
            "num_hidden_layers": 1,
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)},
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": eos_token_id,
            "torch_dtype": "float32",
        }

    @classmethod
    def like(cls, config: dict, **own) -> DraftShape:
        """The shape `config` (a config.json) gives each field that `own` does not set."""
        return cls(
            **{f.name: config[f.name] for f in fields(cls) if f.name not in own and f.name in config}, **own
        )

    @classmethod
    def from_config_json(cls, cfg: dict) -> DraftShape:
        return cls.like(
            cfg,
            draft_vocab_size=cfg.get("draft_vocab_size", cfg["vocab_size"]),
            aux_layer_ids=tuple(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
        )


class Attention(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(2 * s.hidden_size, s.num_attention_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_attention_heads * s.head_dim, s.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(b, t, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        rep = s.num_attention_heads // s.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """q [B, nh, T, hd] of step len(keys)-1; keys[0] causal over positions, keys[1:] the chain (diagonal)."""
        b, nh, t, hd = q.shape
        scale = hd**-0.5
        prefix = (q @ keys[0].transpose(-1, -2)) * scale
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        prefix = prefix.masked_fill(~causal, float("-inf"))
        chain = [((q * k).sum(-1, keepdim=True) * scale) for k in keys[1:]]
        probs = torch.softmax(torch.cat([prefix, *chain], dim=-1), dim=-1)
        out = probs[..., :t] @ values[0]
        for j, v in enumerate(values[1:]):
            out = out + probs[..., t + j : t + j + 1] * v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, nh * hd))


class MLP(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.mlp = MLP(s)


def rope_tables(s: DraftShape, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (
        s.rope_theta
        ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32, device=positions.device) / s.head_dim)
    )
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Eagle3Draft(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.s = s
        n_aux = len(s.aux_layer_ids)
        self.fc = nn.Linear(n_aux * s.hidden_size, s.hidden_size, bias=False)
        self.midlayer = MidLayer(s)
        self.norm = nn.RMSNorm(s.hidden_size, eps=s.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(s.vocab_size, dtype=torch.bool))

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """draft_ids: the target ids the draft predicts, ascending; draft id i stands for draft_ids[i]."""
        assert draft_ids.numel() == self.s.draft_vocab_size
        self.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def step(self, tok_emb, hidden, positions, keys, values):
        """One draft step over [B, T] positions; appends its K/V to keys/values; returns (h, logits)."""
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm(tok_emb), layer.hidden_norm(hidden)], dim=-1)
        cos, sin = rope_tables(self.s, positions)
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        keys.append(k)
        values.append(v)
        h = layer.self_attn.attend(q, keys, values) + hidden
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, self.lm_head(self.norm(h))

    def unroll(
        self, embed: nn.Embedding, ids: torch.Tensor, aux: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """Training-time test. ids [B, L] the sequence, aux [B, L, n*H] the target's captured states.

        Returns `steps` logits tensors [B, L-1, draft_vocab]; entry k at array position t predicts the
        token at t+k+2 (positions past the end read a padding token and must be masked by the caller).
        """
        b, length = ids.shape
        t = length - 1
        hidden = self.fc(aux[:, :t])
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out = []
        base = torch.arange(t, device=ids.device)
        pad = ids.new_zeros(b, steps)
        padded = torch.cat([ids, pad], dim=1)
        for k in range(steps):
            tok = padded[:, 1 + k : 1 + k + t]
            hidden, logits = self.step(embed(tok), hidden, base + k, keys, values)
            out.append(logits)
        return out


def save_draft(model: Eagle3Draft, out_dir: Path, eos_token_id: int) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in model.state_dict().items()
        if name != "t2d" or model.s.draft_vocab_size < model.s.vocab_size
    }
    tensors = {n: (t.float() if t.is_floating_point() else t) for n, t in tensors.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(model.s.config_json(eos_token_id), indent=2) + "\n")
    for path in out_dir.iterdir():
        path.chmod(0o644)


def load_draft(folder: Path) -> Eagle3Draft:
    from safetensors.torch import load_file

    shape = DraftShape.from_config_json(json.loads((folder / "config.json").read_text()))
    model = Eagle3Draft(shape)
    state = load_file(str(folder / "model.safetensors"))
    if "t2d" not in state:
        state["t2d"] = torch.ones(shape.vocab_size, dtype=torch.bool)
    model.load_state_dict(state, strict=True)
    return model.eval()
