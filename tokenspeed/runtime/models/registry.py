"""Model classes by `config.architectures` name, imported only when picked."""

from __future__ import annotations

import importlib

from torch import nn

# architecture name -> (module under tokenspeed.runtime.models, class name)
_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_ARCHITECTURES)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _ARCHITECTURES:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(supported_architectures())}"
        )
    module_name, class_name = _ARCHITECTURES[architecture]
    module = importlib.import_module(f"tokenspeed.runtime.models.{module_name}")
    return getattr(module, class_name)
