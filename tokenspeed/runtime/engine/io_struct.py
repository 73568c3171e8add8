"""Messages between the main process (HTTP + AsyncLLM) and the scheduler processes.

Every message is a dataclass of plain values, encoded with msgpack as `[kind, fields]` by `encode` and
decoded by `decode`; nothing is ever unpickled from a socket. The offline Engine uses the same objects
in process, without encoding them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgpack


@dataclass
class GenerateRequest:
    """A tokenized request. One per sequence: `n > 1` is fanned out by the front end."""

    rid: str
    input_ids: list[int]
    sampling: dict[str, Any]  # SamplingParams.to_dict()
    stream: bool = False
    arrival_time: float = 0.0


@dataclass
class AbortRequest:
    rid: str


@dataclass
class FlushCacheRequest:
    pass


@dataclass
class RequestOutput:
    """What one step produced for one request: the new token ids since the last output.

    finish_reason is None while running, else "stop" (EOS, stop token), "length" or "abort".
    """

    rid: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    matched_stop: int | None = None  # the stop token id that ended the request, if any
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    new_logprobs: list[float] | None = None
    # per new token, [token id, logprob] of the most likely tokens (sampling.top_logprobs of them)
    new_top_logprobs: list[list[list[float]]] | None = None
    error: str | None = None
    dp_rank: int = 0  # the data-parallel group that served the request (set by its scheduler process)
    # Wall-clock time (time.time(), the clock of GenerateRequest.arrival_time) the scheduler first put the
    # request in a batch; kept across preemption. None if it never was (aborted while waiting).
    first_scheduled_time: float | None = None
    # In the request's first output, with sampling.prompt_logprobs: per prompt token, None or
    # [logprob, rank, [[token id, logprob], ...] most likely first] (Request.prompt_logprobs)
    prompt_logprobs: list[list | None] | None = None


@dataclass
class BatchOutput:
    outputs: list[RequestOutput]


@dataclass
class StatsSnapshot:
    """A scheduler's live state, sent to the front end for /metrics and /get_server_info."""

    dp_rank: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_pages_used: int = 0
    kv_pages_total: int = 0
    block_size: int = 1
    prefix_cache_hits: int = 0  # tokens, cumulative
    prefix_cache_queries: int = 0  # tokens, cumulative
    num_preemptions: int = 0  # cumulative
    gen_throughput: float = 0.0  # generated tokens/s over the last logging window
    iteration_tokens: list[int] = field(default_factory=list)  # tokens per step since the last snapshot
    num_nan_aborted: int = 0
    timestamp: float = 0.0
    # MoE expert load over the recorder window (tokenspeed.runtime.moe.expert_stats); None without a
    # MoE model or with the expert recorder off
    expert_layers: list[int] | None = None
    expert_load: list[list[int]] | None = None  # [moe layer][logical expert] tokens
    expert_rank_load: list[list[int]] | None = None  # [moe layer][EP rank] tokens
    eplb_balancedness: list[float] | None = None  # [moe layer] mean / max tokens per EP rank
    eplb_rebalances: int = 0
    eplb_rebalance_seconds: float = 0.0  # decoding stalled by all rebalances so far
    # Speculative decoding (cumulative counts; lengths since the last snapshot); zero when it is off
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_acceptance_lengths: list[int] = field(default_factory=list)
    spec_mean_acceptance_length: float = 0.0  # 1 + accepted / drafts, since start
    spec_accepted_per_pos: list[int] = field(default_factory=list)  # [j]: drafts at position j accepted

    @property
    def kv_usage(self) -> float:
        return self.kv_pages_used / self.kv_pages_total if self.kv_pages_total else 0.0


@dataclass
class ReadyMessage:
    """Sent once by each scheduler rank when its model is loaded and its KV pool is sized."""

    dp_rank: int
    tp_rank: int
    max_total_tokens: int
    max_req_input_len: int
    max_model_len: int
    # seconds of this rank's start-up phases, in order (process start and imports, device init, model config,
    # model and weights, KV cache, ..., CUDA graphs, then "other": what no phase covers): logged at READY
    startup: dict[str, float] = field(default_factory=dict)


@dataclass
class StartupFailed:
    """Sent by a scheduler rank whose engine could not be built, in place of its ReadyMessage, so the front
    end (or the offline Engine) says why the rank will never be ready, not only that its process exited."""

    dp_rank: int
    tp_rank: int
    error: str


@dataclass
class RpcRequest:
    """Control calls from the HTTP layer (expert recording, flush, ...)."""

    method: str
    args: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""


@dataclass
class RpcResponse:
    call_id: str
    ok: bool
    result: Any = None
    error: str | None = None
    # Set when not ok because the call cannot apply to this server (HTTP 400), not a failure: a short code
    # naming why (the OpenAI-style error code), e.g. "not_enabled", "nothing_recorded".
    refused: str | None = None


class ControlRefused(ValueError):
    """Raised by a control call that cannot apply to this server as it runs (the caller's to fix): the
    scheduler answers it with `RpcResponse.refused` set to `code`, not as a failure of the rank."""

    def __init__(self, message: str, code: str = "not_enabled") -> None:
        super().__init__(message)
        self.code = code


_MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        GenerateRequest,
        AbortRequest,
        FlushCacheRequest,
        RequestOutput,
        BatchOutput,
        StatsSnapshot,
        ReadyMessage,
        StartupFailed,
        RpcRequest,
        RpcResponse,
    )
}


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(x) for x in obj]
    return obj


def encode(msg: Any) -> bytes:
    kind = type(msg).__name__
    if kind not in _MESSAGE_TYPES:
        raise TypeError(f"not a TokenSpeed message: {kind}")
    return msgpack.packb([kind, _to_plain(msg)], use_bin_type=True)


def decode(data: bytes) -> Any:
    kind, fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
    cls = _MESSAGE_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown message kind {kind!r}")
    if cls is BatchOutput:
        return BatchOutput(outputs=[RequestOutput(**o) for o in fields["outputs"]])
    return cls(**fields)
