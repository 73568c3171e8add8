"""Qwen3: the Llama decoder with RMSNorm on each query and key head before the rotary embedding."""

from __future__ import annotations

from tokenspeed.runtime.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
