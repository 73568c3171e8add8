"""What the memory model needs of a model: its shape from config.json, without building it.

The console plans from a config.json it reads itself (no torch, no model classes); the server builds the
model. `tests/console/test_plan_agrees.py` checks this shape's weight estimate against the parameters of
the real model built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes of one element by the names config.json uses for `torch_dtype`.
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1, "fp8": 1}


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # dense MLP width as config.json gives it (0 when absent)
    num_experts: int
    moe_intermediate: int
    shared_expert_intermediate: int
    tie_embeddings: bool
    config_dtype: str  # `torch_dtype` of config.json ("bfloat16", "float32", ...)
    max_position: int
    # the checkpoint stores its linear layers and experts in FP8 (quantization_config in config.json)
    fp8_checkpoint: bool = False

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one checkpoint element (what `--dtype auto` keeps on a GPU unless it is float32)."""
        return DTYPE_BYTES.get(self.config_dtype, 2)

    @property
    def attention_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return self.num_layers * (q + kv + o)

    @property
    def dense_params(self) -> int:
        width = self.intermediate if not self.num_experts else self.shared_expert_intermediate
        router = self.hidden * self.num_experts
        return self.num_layers * (3 * self.hidden * width + router + 2 * self.hidden)

    @property
    def expert_params(self) -> int:
        return self.num_layers * self.num_experts * 3 * self.hidden * self.moe_intermediate

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def weights_bytes_per_gpu(
        self,
        dtype_bytes: int,
        attn_tp: int,
        dense_tp: int,
        moe_tp: int,
        moe_ep: int,
        redundant_experts: int = 0,
        checkpoint_bytes: int | None = None,
        layer_bytes: int | None = None,
    ) -> int:
        """Weights on one GPU: attention and embeddings split by attention TP, dense layers by dense TP,
        experts by MoE TP x EP (EP ranks hold (experts + redundant) / EP slots each). `layer_bytes` (1 for
        FP8 weights) is the element size of the decoder layers' weights; embeddings keep `dtype_bytes`. A
        checkpoint's real size scales the estimate (it knows about biases and layers left unquantized)."""
        experts = self.expert_params
        if self.num_experts and (moe_ep > 1 or redundant_experts > 0):  # the server's choice of EP
            experts = experts * (self.num_experts + redundant_experts) // self.num_experts // moe_ep
        else:
            experts = experts // max(moe_tp, 1)
        layers = self.attention_params / max(attn_tp, 1) + self.dense_params / max(dense_tp, 1) + experts
        per_gpu = (
            layers * (layer_bytes or dtype_bytes) + self.embedding_params / max(attn_tp, 1) * dtype_bytes
        )
        if checkpoint_bytes:
            stored = 1 if self.fp8_checkpoint else self.dtype_bytes
            layer_params = self.attention_params + self.dense_params + self.expert_params
            per_gpu *= checkpoint_bytes / (layer_params * stored + self.embedding_params * self.dtype_bytes)
        return int(per_gpu)


def model_shape(config: dict) -> ModelShape:
    """The shape of a Hugging Face config.json (or its `text_config`)."""
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
        config_dtype=dtype,
        max_position=int(text.get("max_position_embeddings") or 4096),
        fp8_checkpoint=_is_fp8(config.get("quantization_config") or text.get("quantization_config")),
    )


def _is_fp8(quant_config: dict | None) -> bool:
    # the methods tokenspeed.config.quantization reads as FP8; the server refuses any other at load
    return bool(quant_config) and quant_config.get("quant_method") in (
        "fp8",
        "compressed-tensors",
        "modelopt",
    )
