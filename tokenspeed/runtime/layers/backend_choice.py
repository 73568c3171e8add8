"""A `--*-backend` flag whose choices are `auto`, `torch` (the reference, everywhere) and `triton` (a
CUDA GPU with the triton package): the name checked against the build's choices, `auto` resolved for the
device, and a clear error when `triton` cannot run here."""

from __future__ import annotations

from collections.abc import Callable

import torch


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def require_triton(flag: str, device: torch.device) -> None:
    """Raise ValueError naming `flag` and the fix when its `triton` choice cannot run on `device`."""
    if device.type != "cuda":
        raise ValueError(f"{flag} triton needs a CUDA GPU; use {flag} auto or torch on the CPU")
    if not triton_available():
        raise ValueError(f"{flag} triton needs the triton package; install it or use {flag} torch")


def resolve_choice(flag: str, name: str | None, choices: tuple[str, ...], auto: Callable[[], str]) -> str:
    """The backend `name` (None: "auto") stands for: itself, or `auto()` for "auto"; a name not in
    `choices` raises ValueError listing them."""
    name = name or "auto"
    if name not in choices:
        raise ValueError(
            f"{flag} {name!r} is not available in this build; choose one of {', '.join(choices)}"
        )
    return auto() if name == "auto" else name
