"""What the HTTP handlers share: the server's arguments, its AsyncLLM and tokenizer, its life-cycle state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.validate import json_object_flag
from tokenspeed.runtime.engine.async_llm import AsyncLLM
from tokenspeed.runtime.entrypoints.body_parser import BodyParser
from tokenspeed.runtime.entrypoints.request_shape import ShapeLimits
from tokenspeed.runtime.metrics.collector import ServerMetrics

STARTING, READY, DRAINING = "starting", "ready", "draining"


@dataclass
class ServerState:
    server_args: ServerArgs
    llm: AsyncLLM
    tokenizer: Any
    metrics: ServerMetrics | None
    served_model_names: list[str]
    preferred_sampling_params: dict[str, Any] | None = None
    status: str = STARTING
    started_at: float = field(default_factory=time.time)
    child_pids: dict[str, int] = field(default_factory=dict)
    grammar: Any = None  # the GrammarBackend that checks constraints, built on the first that needs it
    bodies: BodyParser = field(default_factory=BodyParser)  # request bodies parsed off the event loop
    # request fields accepted with no effect that the log has named already (each is logged once)
    reported_fields: set[str] = field(default_factory=set)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def ready(self) -> bool:
        return self.status == READY

    def shape_limits(self) -> ShapeLimits:
        limits = self.llm.limits
        return ShapeLimits(
            max_sequences=self.server_args.max_sequences_per_request,
            max_prompt_tokens=limits.max_req_input_len if limits is not None else None,
        )

    def accepts_model(self, name: str | None) -> bool:
        # An empty model field means "whatever is served"; the model path is accepted as an alias.
        return not name or name in self.served_model_names or name == str(self.server_args.model)


def served_names(server_args: ServerArgs) -> list[str]:
    raw = server_args.served_model_name or str(server_args.model)
    return [n.strip() for n in str(raw).split(",") if n.strip()] or [str(server_args.model)]


def parse_preferred_sampling_params(server_args: ServerArgs) -> dict[str, Any] | None:
    raw = server_args.preferred_sampling_params
    if not raw:
        return None
    return json_object_flag("preferred_sampling_params", raw)
