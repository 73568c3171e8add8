"""The tiny trained models shipped inside the package, addressable by short name.

`demo` is a dense Llama and `demo-moe` a Qwen3-MoE (8 experts, top-2); both share one byte-level BPE
tokenizer and were trained on the Python documentation (docs/DEMO_MODELS.md has the source, licence
and training record). They let the server, the tests and the demo fleet run on any machine without a
model hub.

Only the exact short names are mapped: `./demo` or an absolute path always means a folder on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"


@dataclass(frozen=True)
class DemoModel:
    name: str
    architecture: str
    description: str

    @property
    def path(self) -> Path:
        return ASSETS_DIR / self.name


DEMO_MODELS: tuple[DemoModel, ...] = (
    DemoModel("demo", "LlamaForCausalLM", "dense Llama, 4 layers, 3.0M parameters"),
    DemoModel("demo-moe", "Qwen3MoeForCausalLM", "Qwen3-MoE, 4 layers, 8 experts top-2, 3.8M parameters"),
)

# Files a loader needs; the check below turns a broken install into a clear error instead of a
# confusing "not a model folder" from deeper in the stack.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def demo_model_names() -> tuple[str, ...]:
    return tuple(m.name for m in DEMO_MODELS)


def is_demo_model(name_or_path: str) -> bool:
    return name_or_path in demo_model_names()


def demo_model_path(name: str) -> Path:
    """The packaged folder of a demo model; raises ValueError for an unknown name or a broken install."""
    for model in DEMO_MODELS:
        if model.name == name:
            missing = [f for f in REQUIRED_FILES if not (model.path / f).is_file()]
            if missing:
                raise ValueError(
                    f"--model-path {name}: the packaged demo model at {model.path} lacks {', '.join(missing)}; "
                    "reinstall tokenspeed (pip install -e .) so its package data is present"
                )
            return model.path
    raise ValueError(f"--model-path {name}: not a demo model; choose one of {', '.join(demo_model_names())}")


def resolve_model_path(name_or_path: str) -> str:
    """Map `demo` / `demo-moe` to their packaged folders; any other value is returned unchanged."""
    if is_demo_model(name_or_path):
        return str(demo_model_path(name_or_path))
    return name_or_path
