"""The pipeline /v1/chat/completions and /v1/completions share: request -> prompt -> sequences -> render.

Each endpoint's module (`serving_chat`, `serving_completions`) holds its whole pipeline as one object: it is
built from the request (model check, sampling parameters, prompt tokens; a 400 for anything wrong), and it
renders the sequences it asked for, as one JSON body or as server-sent events. `serve_pipeline` runs the
middle: it starts the sequences and hands them to the renderer, aborting them whichever way the response
ends.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.engine.async_llm import SequenceOutput
from tokenspeed.runtime.entrypoints.admission import admit
from tokenspeed.runtime.entrypoints.openai.request_fields import IGNORED_HEADER, report_ignored
from tokenspeed.runtime.entrypoints.openai.serving_common import (
    SSE_DONE,
    failure_error,
    first_failure,
    merge,
    new_id,
    now,
    sse,
    start_sequences,
    translate_errors,
    unless_disconnected,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.runtime.entrypoints.streaming import DisconnectAwareStream, closer
from tokenspeed.sampling_params import SamplingParams

Sequences = list[AsyncIterator[SequenceOutput]]


@dataclasses.dataclass(frozen=True)
class CollectedSequence:
    """One sequence run to its end: everything it produced and its last output (finish reason, usage)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    final: SequenceOutput
    top_logprobs: list[list[list[float]]] | None = None  # per token, [id, logprob] of the most likely
    prompt_logprobs: list | None = None  # per prompt token, with prompt logprobs asked for (SequenceOutput's)


@dataclasses.dataclass(kw_only=True)
class Pipeline(abc.ABC):
    """One OpenAI request once its prompts and sampling are known: what to run, and how to render it.
    Each endpoint subclasses it with what its rendering needs, and a `prepare` from its request."""

    # Each endpoint's: the prefix of its response ids and its path (named in the ignored-fields report).
    id_prefix: ClassVar[str]
    path: ClassVar[str]

    state: ServerState
    req: Any  # the endpoint's request (protocol.py): n, stream, stream_options, logprobs, rid, ...
    model: str
    prompts: list[list[int]]
    params: SamplingParams
    created: int = dataclasses.field(default_factory=now)
    # From the request and the server, once the request is known to be good:
    rid: str = dataclasses.field(init=False)  # the client's own rid, else a new id
    cache_report: bool = dataclasses.field(init=False)  # --enable-cache-report: usage counts cached tokens
    ignored: tuple[str, ...] = dataclasses.field(init=False)  # fields sent that change nothing

    def __post_init__(self) -> None:
        self.rid = self.req.rid or new_id(self.id_prefix)
        self.cache_report = self.state.server_args.enable_cache_report
        self.ignored = report_ignored(self.state.reported_fields, self.req, self.path)

    @property
    def n(self) -> int:
        """Sequences per prompt."""
        return self.req.n

    @property
    def stream(self) -> bool:
        return self.req.stream

    @abc.abstractmethod
    def body(self, sequences: list[CollectedSequence]) -> dict[str, Any]:
        """The JSON answer, from every sequence run to its end (none of them cut short)."""

    @abc.abstractmethod
    def events(self, gens: Sequences) -> AsyncIterator[str]:
        """The server-sent events of the streamed answer, as the sequences produce output."""

    def chunk(self, kind: str, choices: list[dict[str, Any]], usage_obj: dict[str, Any] | None = None) -> str:
        """One server-sent event: a stream chunk of this response."""
        return sse(response_body(self.rid, kind, self.created, self.model, choices, usage_obj))


def response_body(
    rid: str,
    kind: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_obj: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OpenAI response object or stream chunk; ``usage`` only when given."""
    body: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
    if usage_obj is not None:
        body["usage"] = usage_obj
    return body


async def collect_sequences(gens: Sequences) -> list[CollectedSequence]:
    """Run every sequence to its end, in request order."""
    n = len(gens)
    texts: list[list[str]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    tops: list[list[list[list[float]]] | None] = [None] * n
    final: list[SequenceOutput | None] = [None] * n
    prompt_lps: list[list | None] = [None] * n
    async for i, out in merge(gens):
        if out.prompt_logprobs is not None:
            prompt_lps[i] = out.prompt_logprobs
        texts[i].append(out.text)
        ids[i].extend(out.token_ids)
        if out.logprobs:
            lps[i].extend(out.logprobs)
        if out.top_logprobs is not None:
            tops[i] = (tops[i] or []) + out.top_logprobs
        if out.finished:
            final[i] = out
    collected = []
    for i, out in enumerate(final):
        assert out is not None  # merge ends only after every sequence finished
        collected.append(CollectedSequence("".join(texts[i]), ids[i], lps[i], out, tops[i], prompt_lps[i]))
    return collected


async def sse_events(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``, then ``[DONE]``. The status line is already sent, so a failure becomes an error event."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
    except Exception as exc:
        yield translate_errors(exc).sse()
    yield SSE_DONE


async def serve_pipeline(state: ServerState, request: Request, pipeline: Pipeline) -> Response:
    """Start the pipeline's sequences; stream its events, or answer its body once every sequence ended.

    Errors that concern the request (400, 503) are raised here, before any response starts. The
    sequences are aborted whichever way the response ends, the client leaving included.
    """
    p = pipeline
    admit(state, len(p.prompts) * p.n, sum(len(ids) for ids in p.prompts) * p.n)
    try:
        gens = await start_sequences(state, p.prompts, p.params, p.n, p.rid, p.stream)
    except Exception as exc:
        raise translate_errors(exc) from exc
    headers = {IGNORED_HEADER: ", ".join(p.ignored)} if p.ignored else None
    if p.stream:
        stream = DisconnectAwareStream(sse_events(p.events(gens)), closer(gens))
        stream.headers.update(headers or {})
        return stream
    try:
        result = await unless_disconnected(request, _body(p, gens))
    finally:
        await closer(gens)()
    return JSONResponse(result, headers=headers)


async def _body(pipeline: Pipeline, gens: Sequences) -> dict[str, Any]:
    sequences = await collect_sequences(gens)
    failure = first_failure([seq.final for seq in sequences])
    if failure is not None:
        raise failure_error(failure)  # a cut-off answer is an error, never a 200 that looks complete
    return pipeline.body(sequences)
