"""What a scheduler process's event loop calls on its engine: the `EngineCore` of a rank, alone or leading
its tensor-parallel peers. A TP peer runs a `PeerEngine` instead, which only follows its rank 0."""

from __future__ import annotations

from typing import Any, Protocol

from tokenspeed.runtime.engine.io_struct import GenerateRequest, RequestOutput, StatsSnapshot


class EngineProtocol(Protocol):
    max_total_tokens: int
    max_req_input_len: int
    max_model_len: int
    startup_seconds: dict[str, float]  # the model runner's start-up phases, for the ready message

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request; ValueError (naming the fix) for one that cannot run."""

    def abort_request(self, rid: str, reason: str = "abort") -> bool: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def stats(self) -> StatsSnapshot: ...

    def flush_cache(self) -> bool: ...

    def control(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        """A control call by name (the MoE expert calls); `ControlRefused` when this server cannot honour
        it, ValueError for a name it does not know."""

    def shutdown(self) -> None: ...
