"""The `demo` Llama in plain torch, for training its EAGLE3 draft: batched greedy generation and state capture.

transformers' `generate` spends most of a CPU step in per-call Python overhead; this forward is the same
arithmetic in a few tensor operations (float32), with a KV cache for left-padded batches. It also returns
the residual stream after the decoder layers a draft captures (hidden + residual, before the final norm).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.nn import functional as F


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DemoTarget:
    def __init__(self, folder: Path, aux_layer_ids: tuple[int, ...]):
        from safetensors.torch import load_file

        cfg = json.loads((folder / "config.json").read_text())
        self.w = load_file(str(folder / "model.safetensors"))
        self.n_layers = cfg["num_hidden_layers"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.embed = torch.nn.Embedding.from_pretrained(self.w["model.embed_tokens.weight"], freeze=True)
        self.aux_layer_ids = aux_layer_ids
        self.vocab_size = cfg["vocab_size"]

    def forward(self, ids, positions, key_ok, cache=None):
        """ids/positions [B, T]; key_ok [B, T, S] which keys each query may read (S = cached + T).

        Returns (logits [B, T, V], aux [B, T, len(aux)*H]); `cache` (a list, one (k, v) per layer) grows.
        """
        w, b, t = self.w, ids.shape[0], ids.shape[1]
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        x = self.embed(ids)
        aux = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"], self.eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(b, t, self.nh, self.hd).transpose(1, 2)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(b, t, self.nkv, self.hd).transpose(1, 2)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, t, self.nkv, self.hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if cache is not None:
                if len(cache) > i:
                    k = torch.cat([cache[i][0], k], dim=2)
                    v = torch.cat([cache[i][1], v], dim=2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_ok[:, None], enable_gqa=True)
            x = x + attn.transpose(1, 2).reshape(b, t, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"], self.eps)
            gate = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + gate @ w[p + "mlp.down_proj.weight"].T
            if i in self.aux_layer_ids:
                aux.append(x)
        logits = rms(x, w["model.norm.weight"], self.eps) @ self.embed.weight.T
        return logits, torch.cat(aux, dim=-1)

    @torch.no_grad()
    def states(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux, logits) for right-padded full sequences (padding is after every real position)."""
        b, t = ids.shape
        causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, t, t)
        logits, aux = self.forward(ids, torch.arange(t).expand(b, t), causal)
        return aux, logits

    @torch.no_grad()
    def greedy(self, prompts: list[list[int]], max_new: int, eos: tuple[int, ...]) -> list[list[int]]:
        """Greedy continuations (up to and including the first EOS) of a batch of prompts, left-padded."""
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(b, width, dtype=torch.long)
        valid = torch.zeros(b, width, dtype=torch.bool)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            valid[row, width - len(p) :] = True
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        # A padding query still reads itself, so its softmax is defined; nothing real ever reads it.
        key_ok = valid[:, None, :] & torch.ones(width, width, dtype=torch.bool).tril()
        key_ok |= torch.eye(width, dtype=torch.bool)
        cache: list = []
        logits, _ = self.forward(ids, positions, key_ok, cache)
        out: list[list[int]] = [[] for _ in range(b)]
        done = torch.zeros(b, dtype=torch.bool)
        nxt = logits[:, -1].argmax(-1)
        pos = positions[:, -1]
        for _ in range(max_new):
            for row in range(b):
                if not done[row]:
                    out[row].append(int(nxt[row]))
                    done[row] = int(nxt[row]) in eos
            if bool(done.all()):
                break
            pos = pos + 1
            valid = torch.cat([valid, torch.ones(b, 1, dtype=torch.bool)], dim=1)
            logits, _ = self.forward(nxt[:, None], pos[:, None], valid[:, None, :], cache)
            nxt = logits[:, -1].argmax(-1)
        return out
