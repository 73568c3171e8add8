"""What the engine needs to know about a model, read once from its local Hugging Face folder."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokenspeed.config.quantization import WeightQuant, weight_quant
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.validate import json_object_flag
from tokenspeed.runtime.models.registry import supported_architectures

DTYPE_CHOICES: dict[str, torch.dtype] = {
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}

_MAX_LEN_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


def resolve_model_path(model: str) -> str:
    """A local folder holding config.json; demo model names resolve through `tokenspeed.demo_models`."""
    try:
        from tokenspeed.demo_models import resolve_model_path as resolve_demo
    except ImportError:
        resolve_demo = None
    path = str(resolve_demo(model)) if resolve_demo is not None else model
    path = os.path.expanduser(path)
    if not os.path.isdir(path):
        raise ValueError(
            f"model {model!r} is not a local folder. TokenSpeed runs offline and cannot download from the "
            "Hugging Face hub; download the model elsewhere and pass its local folder with --model"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"model folder {path!r} has no config.json; --model must name a Hugging Face model folder"
        )
    return path


def parse_hf_overrides(hf_overrides: str | dict[str, Any] | None) -> dict[str, Any]:
    if not hf_overrides:
        return {}
    return json_object_flag("hf_overrides", hf_overrides) or {}


def load_hf_config(path: str, overrides: dict[str, Any], trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    if not overrides:
        return config
    overrides = dict(overrides)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        # Newer configs keep theta and scaling together in rope_parameters; fold the older names in.
        merged = dict(rope)
        if "rope_scaling" in overrides:
            merged = {
                "rope_theta": merged.get("rope_theta", 10000.0),
                **(overrides.pop("rope_scaling") or {}),
            }
        if "rope_theta" in overrides:
            merged["rope_theta"] = overrides.pop("rope_theta")
        merged.update(overrides.pop("rope_parameters", None) or {})
        overrides["rope_parameters"] = merged
    return type(config).from_dict({**config.to_dict(), **overrides})


def resolve_dtype(dtype: str, config_dtype: Any, device: str) -> torch.dtype:
    """The seed's --dtype rule; "auto" keeps a float32 model in float32 on the CPU."""
    if dtype != "auto":
        if dtype not in DTYPE_CHOICES:
            raise ValueError(f"--dtype {dtype!r} is not one of auto, {', '.join(DTYPE_CHOICES)}")
        return DTYPE_CHOICES[dtype]
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype.replace("torch.", ""), None)
    if config_dtype in (torch.float16, torch.bfloat16):
        return config_dtype
    return torch.float32 if device == "cpu" else torch.float16


def _config_max_len(hf: Any) -> int:
    for key in _MAX_LEN_KEYS:
        value = getattr(hf, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def _eos_ids(hf: Any, path: str) -> list[int]:
    ids: list[int] = []
    sources = [getattr(hf, "eos_token_id", None)]
    gen_path = Path(path) / "generation_config.json"
    if gen_path.is_file():
        sources.append(json.loads(gen_path.read_text()).get("eos_token_id"))
    for src in sources:
        for i in src if isinstance(src, list) else [src]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids


@dataclass
class ModelConfig:
    model_path: str
    hf_config: Any = field(repr=False)
    architecture: str
    model_type: str
    dtype: torch.dtype
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: list[int]
    tie_word_embeddings: bool
    is_moe: bool
    num_experts: int
    num_experts_per_tok: int
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    # FP8 weights (a quantized checkpoint, or --quantization fp8); None: weights in `dtype`
    weight_quant: WeightQuant | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        dtype: str = "auto",
        hf_overrides: str | dict[str, Any] | None = "{}",
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
        device: str | None = None,
        quantization: str | None = None,
    ) -> ModelConfig:
        local = resolve_model_path(path)
        overrides = parse_hf_overrides(hf_overrides)
        # Before transformers reads it: a checkpoint we cannot run is refused by its quantization method.
        quant = weight_quant(json.loads(Path(local, "config.json").read_text()), quantization, path)
        hf = load_hf_config(local, overrides, trust_remote_code)
        archs = list(getattr(hf, "architectures", None) or [])
        supported = supported_architectures()
        arch = next((a for a in archs if a in supported), None)
        if arch is None:
            raise ValueError(
                f"model {path!r} has architectures {archs}, none of which TokenSpeed implements; "
                f"supported: {', '.join(supported)}"
            )
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        device_type = torch.device(device).type
        config_dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
        num_heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
        limit = _config_max_len(hf)
        if max_model_len is None:
            max_len = limit
        elif max_model_len <= 0:
            raise ValueError(f"--max-model-len must be positive, got {max_model_len}")
        elif max_model_len > limit:
            raise ValueError(
                f"--max-model-len {max_model_len} is larger than the {limit} tokens {path!r} supports "
                "(max_position_embeddings in config.json); lower --max-model-len, or raise "
                "max_position_embeddings with --hf-overrides if the model was trained for longer contexts"
            )
        else:
            max_len = max_model_len
        num_experts = int(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) or 0)
        config = cls(
            model_path=local,
            hf_config=hf,
            architecture=arch,
            model_type=getattr(hf, "model_type", ""),
            dtype=resolve_dtype(dtype, config_dtype, device_type),
            num_layers=hf.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            hidden_size=hf.hidden_size,
            intermediate_size=getattr(hf, "intermediate_size", 0),
            vocab_size=hf.vocab_size,
            max_model_len=max_len,
            eos_token_ids=_eos_ids(hf, local),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            is_moe=num_experts > 0,
            num_experts=num_experts,
            num_experts_per_tok=int(getattr(hf, "num_experts_per_tok", 0) or 0) if num_experts else 0,
            hf_overrides=overrides,
            weight_quant=quant,
        )
        config._check_sliding_window()
        return config

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> ModelConfig:
        device = args.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"
        return cls.from_pretrained(
            args.model,
            dtype=args.dtype,
            hf_overrides=args.hf_overrides,
            max_model_len=args.max_model_len,
            trust_remote_code=args.trust_remote_code,
            device=device,
            quantization=args.quantization,
        )

    @property
    def rms_norm_eps(self) -> float:
        return float(getattr(self.hf_config, "rms_norm_eps", 1e-6))

    def _check_sliding_window(self) -> None:
        # Full attention equals sliding-window attention while the context fits in the window; beyond
        # it the outputs would differ, so refuse rather than silently attend too far.
        hf = self.hf_config
        window = getattr(hf, "sliding_window", None)
        layer_types = getattr(hf, "layer_types", None) or []
        slides = "sliding_attention" in layer_types or self.model_type in ("mistral", "qwen3_moe")
        if slides and isinstance(window, int) and 0 < window < self.max_model_len:
            raise ValueError(
                f"{self.architecture} uses sliding-window attention ({window} tokens), which TokenSpeed does "
                f"not implement; pass --max-model-len {window} or less"
            )
