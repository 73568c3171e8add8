"""The launcher a profile's `[fleet] launcher` names: above the interface (base.py) and both launchers.

Ray itself is imported only when a Ray launcher acts, so a local fleet never pays for it.
"""

from __future__ import annotations

from pathlib import Path

from console.launchers.base import Launcher
from console.launchers.local import LocalLauncher
from console.launchers.ray_launcher import RayLauncher


def make_launcher(
    kind: str,
    command: tuple[str, ...] | None,
    state_dir: Path,
    ray_address: str | None = None,
    log_max_bytes: int = 0,
    log_backups: int = 0,
) -> Launcher:
    if kind == "local":
        return LocalLauncher(command, log_max_bytes, log_backups)
    if kind == "ray":
        return RayLauncher(command, state_dir, ray_address)
    raise ValueError(f"unknown launcher {kind!r}: use local or ray in [fleet] launcher")
