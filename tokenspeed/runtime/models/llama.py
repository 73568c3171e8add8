"""Llama-family decoder (Llama 2/3, Mistral-style), shared by the Qwen2/Qwen3/Qwen3-MoE models.

Variants differ only in small switches: bias on q/k/v (Qwen2), RMSNorm on q and k per head (Qwen3), and the
MLP (a gated MLP or a sparse MoE block). The model reads everything from the ForwardBatch and returns
float32 logits of each request's last new token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from tokenspeed.runtime.layers.activation import check_hidden_act
from tokenspeed.runtime.layers.attention import PagedAttention
from tokenspeed.runtime.layers.embedding import LMHead, VocabEmbedding
from tokenspeed.runtime.layers.linear import QKVLinear, RowLinear
from tokenspeed.runtime.layers.mlp import GatedMLP
from tokenspeed.runtime.layers.norm import RMSNorm
from tokenspeed.runtime.layers.rotary import RotaryEmbedding, rope_parameters
from tokenspeed.runtime.models.weight_utils import WeightTarget, load_checkpoint_weights

if TYPE_CHECKING:
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch
    from tokenspeed.runtime.models.model_config import ModelConfig

# checkpoint projection -> (stacked module, shard)
_STACKED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, qkv_bias: bool, o_bias: bool, qk_norm: bool):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.qkv_proj = QKVLinear(
            config.hidden_size, config.head_dim, config.num_heads, config.num_kv_heads, bias=qkv_bias
        )
        self.o_proj = RowLinear(config.num_heads * config.head_dim, config.hidden_size, bias=o_bias)
        if qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.attn = PagedAttention(
            config.num_heads, config.num_kv_heads, config.head_dim, config.head_dim**-0.5, layer_id
        )

    def forward(self, cos_sin: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        t = hidden.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        # The attention layer applies the q/k norms (Qwen3) and RoPE, fused with the KV-cache write on the GPU.
        qk_norm = None if self.q_norm is None else (self.q_norm, self.k_norm)
        out = self.attn(q, k, v, fb, cos_sin=cos_sin, qk_norm=qk_norm)
        return self.o_proj(out)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, attention: nn.Module, mlp: nn.Module):
        super().__init__()
        self.layer_id = layer_id
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, cos_sin: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's output, the residual stream before it)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(cos_sin, hidden, fb)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden, fb), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, layers: list[nn.Module]):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.max_model_len, rope_parameters(config.hf_config)
        )
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        hidden = self.embed_tokens(fb.input_ids)
        cos_sin = self.rotary_emb.cos_sin(fb.positions, hidden.dtype)
        residual = None
        capture = fb.aux_capture
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(cos_sin, hidden, residual, fb)
            if capture is not None and capture.wants(i):
                capture.states[i] = hidden + residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    qkv_bias = False  # Llama: config.attention_bias decides
    qk_norm = False

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        check_hidden_act(getattr(config.hf_config, "hidden_act", "silu"), config.architecture)
        layers = [self.make_layer(i) for i in range(config.num_layers)]
        self.model = LlamaModel(config, layers)
        self.lm_head = LMHead(config.vocab_size, config.hidden_size)
        self.tie_weights()

    # -- construction hooks the Qwen variants override --
    def make_attention(self, layer_id: int) -> nn.Module:
        bias = bool(getattr(self.config.hf_config, "attention_bias", False))
        return LlamaAttention(
            self.config, layer_id, qkv_bias=bias or self.qkv_bias, o_bias=bias, qk_norm=self.qk_norm
        )

    def make_mlp(self, layer_id: int) -> nn.Module:
        bias = bool(getattr(self.config.hf_config, "mlp_bias", False))
        return GatedMLP(self.config.hidden_size, self.config.intermediate_size, bias=bias)

    def make_layer(self, layer_id: int) -> nn.Module:
        return LlamaDecoderLayer(
            self.config, layer_id, self.make_attention(layer_id), self.make_mlp(layer_id)
        )

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the config ties them (again after materialising)."""
        if self.config.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Float32 logits [B, vocab] of the tokens at `fb.logits_indices`."""
        hidden = self.model(fb)
        return self.lm_head(hidden[fb.logits_indices])

    # -- weights --
    def resolve_weight(self, name: str) -> WeightTarget | None:
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None
        module, _, param = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        if leaf in _STACKED:
            stacked, shard = _STACKED[leaf]
            return WeightTarget(f"{parent}.{stacked}", param, shard)
        return WeightTarget(module, param)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load Hugging Face named tensors; raises ValueError on unexpected or missing weights."""
        return load_checkpoint_weights(self, weights, self.resolve_weight)
