"""The configuration contract of ``tokenspeed serve``: ``ServerArgs``.

Field names, defaults, flags and resolution rules follow the upstream engine's server arguments, so a
command line written for it works here. The fields are declared in ``config.server_fields``, the parser
lives in ``config.cli``, the resolution rules in ``config.resolve`` and the port layout in ``config.ports``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import MutableMapping
from difflib import get_close_matches
from typing import Any

from tokenspeed.config.resolve import resolve_server_args
from tokenspeed.config.server_fields import ServerFields
from tokenspeed.config.validate import server_environment

__all__ = ["ServerArgs"]


@dataclasses.dataclass
class ServerArgs(ServerFields):
    """Every setting of one server. Constructing it resolves defaults and validates (``config.resolve``);
    the resolved instance is frozen, copies with changes go through ``dataclasses.replace``."""

    # Not a field: the platform to resolve against (tests pass one; None probes the real machine). Once
    # resolved, the instance keeps the facts it was resolved against under this name, so that
    # ``dataclasses.replace`` resolves its copy against the same machine without probing it again.
    platform: dataclasses.InitVar[Any] = None

    def __post_init__(self, platform: Any = None) -> None:
        object.__setattr__(self, "_gpu_memory_utilization_defaulted", False)
        facts = resolve_server_args(self, platform)
        object.__setattr__(self, "platform", facts)
        # From here on the instance is frozen: every process and component reads the same resolution.
        object.__setattr__(self, "_resolved", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_resolved", False):
            raise dataclasses.FrozenInstanceError(
                f"ServerArgs is resolved and frozen: cannot set {name!r}; "
                f"build a copy with dataclasses.replace(args, {name}=...)"
            )
        object.__setattr__(self, name, value)

    @property
    def gpu_memory_utilization_defaulted(self) -> bool:
        """True when ``gpu_memory_utilization`` came from the world-size default, not from the user."""
        return bool(self.__dict__["_gpu_memory_utilization_defaulted"])

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-serialisable values; ``mapping`` includes its groups and rank placement."""
        out = dataclasses.asdict(self)
        out["mapping"] = self.mapping.to_dict() if self.mapping is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], platform: Any = None) -> ServerArgs:
        """Rebuild from ``to_dict()`` output (or any field-name dict); the mapping is re-derived."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            hints = [
                f"{key} (did you mean {close[0]}?)" if (close := get_close_matches(key, names, 1)) else key
                for key in unknown
            ]
            raise ValueError(f"unknown ServerArgs fields: {', '.join(hints)}")
        fields = {key: value for key, value in data.items() if key != "mapping"}
        return cls(**fields, platform=platform)

    def environment(self) -> dict[str, str]:
        """Environment variables the server processes need (see ``server_environment``)."""
        return server_environment(self)

    def apply_environment(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Set ``environment()`` in ``environ`` (default ``os.environ``); an explicit PDL setting wins."""
        environ = os.environ if environ is None else environ
        for key, value in self.environment().items():
            if key == "TOKENSPEED_MAMBA_SSM_DTYPE":
                environ[key] = value
            else:
                environ.setdefault(key, value)

    def url(self) -> str:
        try:
            is_v6 = ipaddress.ip_address(self.host).version == 6
        except ValueError:
            is_v6 = False
        host = f"[{self.host}]" if is_v6 else self.host
        return f"http://{host}:{self.port}"

