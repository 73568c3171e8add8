"""Qwen2: the Llama decoder with a bias on the q/k/v projections."""

from __future__ import annotations

from tokenspeed.runtime.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
