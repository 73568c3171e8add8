"""Allowed values of ``ServerArgs`` fields and the value parsers of their flags.

The choices are shared by the parser (so ``--help`` lists them) and by resolution (so a ``ServerArgs``
built from a profile, without argparse, is checked the same way). A field typed ``Literal[...]`` in
``config.server_fields`` states its choices there; ``FIELD_CHOICES`` reads them back rather than repeat them. The flag helpers that read field
defaults are in ``config.flag_table``.
"""

from __future__ import annotations

import argparse
from typing import Any

from tokenspeed.config.server_fields import declared_choices
from tokenspeed.config.support import REASONING_PARSERS_IMPLEMENTED

ATTENTION_BACKENDS = (
    "mha",
    "mla",
    "fa3",
    "fa4",
    "triton",
    "flashinfer",
    "trtllm",
    "trtllm_mla",
    "flashmla",
    "tokenspeed_mla",
    "hybrid_linear_attn",
    # Pure-PyTorch reference; the only one that runs on the CPU.
    "torch",
)
SAMPLING_BACKENDS = (
    "greedy",
    "flashinfer",
    "flashinfer_full",
    "triton",
    "triton_full",
    # Pure-PyTorch sampler honouring temperature/top-p/top-k; the default on the CPU.
    "torch",
)
CPU_ATTENTION_BACKENDS = ("torch",)
CPU_SAMPLING_BACKENDS = ("torch", "greedy")

FIELD_CHOICES: dict[str, tuple[Any, ...]] = {
    "tokenizer_mode": ("auto", "slow", "deepseek_v4"),
    "load_format": ("auto", "pt", "safetensors", "npcache", "dummy", "extensible"),
    "dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "kv_cache_dtype": ("auto", "fp8", "fp8_e4m3"),
    "kv_cache_quant_method": ("none", "per_token_head"),
    "quantization": ("fp8", "mxfp4", "nvfp4", "w8a8_fp8", "compressed-tensors"),
    "device": ("cuda", "cpu"),
    "kvstore_io_backend": ("direct", "kernel"),
    "kvstore_mem_layout": ("layer_first", "page_first", "page_head"),
    "kvstore_storage_backend": ("mooncake",),
    "mamba_ssm_dtype": ("float32", "bfloat16"),
    "mamba_l2_layout": ("layer_first",),
    "mamba_l2_io_backend": ("direct", "kernel"),
    "log_requests_level": (0, 1, 2),
    "metrics_reporters": ("prometheus",),
    "load_balance_method": ("round_robin", "shortest_queue", "minimum_cache_usage"),
    "attention_backend": ATTENTION_BACKENDS,
    "drafter_attention_backend": ATTENTION_BACKENDS,
    "sampling_backend": SAMPLING_BACKENDS,
    "dense_gemv_backend": ("auto", "triton", "torch"),  # beyond the seed (layers/dense_gemv.py)
    # llguidance: beyond the seed, the alternative backend vLLM and SGLang offer
    "grammar_backend": ("xgrammar", "llguidance", "none"),
    # the parsers that exist (reasoning_parsers.REASONING_PARSERS), not the seed's open-ended names
    "reasoning_parser": tuple(p for p in REASONING_PARSERS_IMPLEMENTED if p is not None),
    "speculative_algorithm": ("EAGLE3", "MTP", "DFLASH", "NGRAM"),
    "speculative_eagle_topk": (1,),
    "mm_attention_backend": ("fa3", "fa4", "triton_attn", "flashinfer_cudnn"),
    "disaggregation_mode": ("null", "prefill", "decode", "encode"),
    "disaggregation_transfer_backend": ("mooncake", "mooncake_async"),
    # Fields typed Literal[...] (ep_dispatch_algorithm, deepep_mode, ...): their type spells the choices.
    **declared_choices(),
}

# Checked by a dedicated rule with a more precise message than a choices error.
CHOICES_CHECKED_ELSEWHERE = frozenset({"speculative_eagle_topk"})

# Other spellings of a field (SGLang's and vLLM's), accepted by the CLI and the offline Engine alike.
FIELD_ALIASES = {
    "model_path": "model",
    "tp_size": "attn_tp_size",
    "tensor_parallel_size": "attn_tp_size",
    "dp_size": "data_parallel_size",
    "expert_parallel_size": "ep_size",
}


def str_to_bool(value: str | bool) -> bool:
    """Parse the usual spellings of a boolean flag value (``1/0``, ``true/false``, ``yes/no``, ``on/off``)."""
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, 1/0, yes/no, on/off), got {value!r}")


def nullable_str(value: str) -> str | None:
    """An optional string flag where an empty value or ``None`` means unset."""
    return None if not value or value == "None" else value
