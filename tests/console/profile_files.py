"""Profile files written by the profile tests, and the error loading a bad one raises."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from console.profile.fleet import ProfileError, load_and_resolve

# The example profiles shipped with the repository.
PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    """Write ``text`` (indented like the test's string literal) as the profile ``tmp_path/name``."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> ProfileError:
    """The error loading and resolving the profile at ``path`` raises (the test fails if none is)."""
    with pytest.raises(ProfileError) as info:
        load_and_resolve(path)
    return info.value
