"""What the planner needs from a model's config.json: parameter groups, dtype, KV size per token."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1, "fp8": 1}


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # dense MLP width (0 for MoE layers without a dense MLP)
    num_experts: int
    moe_intermediate: int
    shared_expert_intermediate: int
    tie_embeddings: bool
    dtype_bytes: int
    max_position: int

    @property
    def attention_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return self.num_layers * (q + kv + o)

    @property
    def dense_params(self) -> int:
        mlp = (
            3 * self.hidden * (self.intermediate if not self.num_experts else self.shared_expert_intermediate)
        )
        router = self.hidden * self.num_experts
        return self.num_layers * (mlp + router + 2 * self.hidden)

    @property
    def expert_params(self) -> int:
        return self.num_layers * self.num_experts * 3 * self.hidden * self.moe_intermediate

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def total_params(self) -> int:
        return self.attention_params + self.dense_params + self.expert_params + self.embedding_params

    def intermediate_per_gpu(self, tp: int) -> int:
        width = self.moe_intermediate if self.num_experts else self.intermediate
        return math.ceil(width / max(tp, 1))

    def weights_per_gpu(self, total_bytes: int | None, attn_tp: int, dense_tp: int, moe_shards: int) -> float:
        """Bytes of weights on one GPU: attention and embeddings split by attention TP, dense layers by
        dense TP, experts by MoE TP x EP. A checkpoint's real size scales the parameter estimate."""
        params = (
            (self.attention_params + self.embedding_params) / attn_tp
            + self.dense_params / dense_tp
            + self.expert_params / max(moe_shards, 1)
        )
        per_gpu = params * self.dtype_bytes
        if total_bytes:
            per_gpu *= total_bytes / (self.total_params * self.dtype_bytes)
        return per_gpu

    def kv_bytes_per_token(self, attn_tp: int, kv_dtype_bytes: int) -> int:
        """K and V of every layer for one token on one GPU; heads replicate when TP exceeds them."""
        heads_per_gpu = max(math.ceil(self.kv_heads / max(attn_tp, 1)), 1)
        return 2 * self.num_layers * heads_per_gpu * self.head_dim * kv_dtype_bytes


def model_shape(config: dict) -> ModelShape:
    text = config.get("text_config", config)
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    experts = int(
        text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts") or 0
    )
    dtype = str(text.get("torch_dtype") or text.get("dtype") or "bfloat16").replace("torch.", "")
    return ModelShape(
        num_layers=int(text["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab=int(text["vocab_size"]),
        intermediate=int(text.get("intermediate_size") or 0),
        num_experts=experts,
        moe_intermediate=int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 0),
        shared_expert_intermediate=int(text.get("shared_expert_intermediate_size") or 0),
        tie_embeddings=bool(text.get("tie_word_embeddings", False)),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        max_position=int(text.get("max_position_embeddings") or 4096),
    )


def find_config(model: str) -> dict | None:
    """config.json of a local model folder, or of a model in the Hugging Face cache (never downloads)."""
    path = Path(model)
    candidates = [path / "config.json"] if path.is_dir() else []
    if not candidates:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
            if isinstance(cached, str):
                candidates.append(Path(cached))
        except Exception:  # no hub library, or a name the hub rejects: nothing cached
            pass
    for candidate in candidates:
        try:
            return json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
    return None


def weights_bytes(model: str, shape: ModelShape | None) -> int | None:
    """Size of the checkpoint's safetensors files when the model is a local folder, else None."""
    path = Path(model)
    if path.is_dir():
        files = list(path.glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files)
    return None
