"""TokenSpeed: an LLM inference server.

`from tokenspeed import Engine, SamplingParams` for offline generation; the exports load lazily so
that `import tokenspeed` (the CLI, the console) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenspeed.runtime.entrypoints.offline import Engine
    from tokenspeed.sampling_params import SamplingParams

__all__ = ["Engine", "SamplingParams"]

_LAZY = {
    "Engine": "tokenspeed.runtime.entrypoints.offline",
    "SamplingParams": "tokenspeed.sampling_params",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenspeed' has no attribute {name!r}")
