"""Where the planner finds a model's config.json and checkpoint size (its shape: tokenspeed.config.model_shape)."""

from __future__ import annotations

import json
from pathlib import Path


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


def checkpoint_bytes(model: str) -> int | None:
    """Size of the checkpoint's safetensors files when the model is a local folder, else None."""
    path = Path(model)
    if path.is_dir():
        files = list(path.glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files)
    return None


def is_moe(model: str) -> bool | None:
    """Whether the model routes tokens to experts, from its config.json (a demo name is found in the
    package); None when its config is not on this machine."""
    from tokenspeed.config.model_shape import model_shape
    from tokenspeed.demo_models import resolve_model_path

    try:
        config = find_config(resolve_model_path(model))
        return model_shape(config).num_experts > 0 if config is not None else None
    except (KeyError, TypeError, ValueError):  # a broken install, a config of another shape
        return None
