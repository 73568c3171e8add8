"""Pieces the chat, completions and native handlers share: fanning out n sequences, errors, disconnects."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from starlette.requests import Request

from tokenspeed.runtime.engine.async_llm import SequenceOutput, ServerUnavailable
from tokenspeed.runtime.engine.prompt_check import PromptTooLong
from tokenspeed.runtime.engine.prompt_encoder import InvalidText, TextTooLong
from tokenspeed.runtime.engine.request_state import RequestFailure
from tokenspeed.runtime.entrypoints.openai.errors import (
    APIError,
    bad_request,
    field_of,
    model_not_found,
    unavailable,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger("tokenspeed.http")

_DISCONNECT_POLL_S = 0.5
# Prompts prepared between two turns of the event loop: a request with many of them lets the loop serve
# other clients' streams every few milliseconds instead of once its whole batch is tokenized and sent.
_ITEMS_PER_TURN = 16


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def check_model(state: ServerState, name: str | None) -> str:
    if not state.accepts_model(name):
        raise model_not_found(name or "")
    return name or state.model_name


def check_logprobs(state: ServerState, wanted: bool) -> None:
    if wanted and not state.server_args.enable_output_logprobs:
        raise bad_request(
            "logprobs: this server was started with --disable-output-logprobs; restart it without that flag",
            param="logprobs",
        )


async def tokenize(state: ServerState, prompt: str | list[int], param: str = "prompt") -> list[int]:
    """Token ids of a prompt; text is tokenized off the event loop (AsyncLLM's PromptEncoder)."""
    if isinstance(prompt, list):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request(f"{param}: token ids must be integers", param=param)
        try:
            state.llm.check_token_ids(param, prompt)
        except ValueError as exc:
            raise bad_request(str(exc), param=param) from exc
        return list(prompt)
    if state.tokenizer is None:
        raise bad_request(
            f"{param}: this server was started with --skip-tokenizer-init and accepts token ids only",
            param=param,
        )
    return await state.llm.prompts.encode(prompt, param)


async def tokenize_all(
    state: ServerState, prompts: list[str | list[int]], param: str = "prompt"
) -> list[list[int]]:
    """Every prompt's token ids, handing the event loop back between batches of them."""
    out = []
    for i, prompt in enumerate(prompts):
        out.append(await tokenize(state, prompt, param))
        if i % _ITEMS_PER_TURN == _ITEMS_PER_TURN - 1:
            await asyncio.sleep(0)
    return out


def translate_errors(exc: BaseException) -> APIError:
    """Map what AsyncLLM and SamplingParams raise to an HTTP error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ServerUnavailable):
        return unavailable(str(exc))
    if isinstance(exc, PromptTooLong):
        return bad_request(str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, TextTooLong):
        return bad_request(str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, InvalidText):
        return bad_request(str(exc), param=exc.param)
    if isinstance(exc, ValueError):
        return bad_request(str(exc), param=getattr(exc, "param", None) or field_of(str(exc)))
    logger.exception("request failed", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")


def failure_error(failure: RequestFailure) -> APIError:
    """What the client of a request the server cut short is told: the status and the cause."""
    return APIError(failure.status, failure.message, code=failure.code)


def first_failure(outputs: list[SequenceOutput]) -> RequestFailure | None:
    return next((o.failure for o in outputs if o.failure is not None), None)


def sequence_params(params: SamplingParams, index: int) -> SamplingParams:
    """The params of sequence `index` of an n > 1 request: distinct seeds, or the samples would be equal."""
    if index == 0 or params.seed is None:
        return dataclasses.replace(params, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids))
    return dataclasses.replace(
        params, seed=params.seed + index, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids)
    )


async def start_sequences(
    state: ServerState,
    prompts: list[list[int]],
    params: SamplingParams,
    n: int,
    rid: str,
    stream: bool,
) -> list[AsyncIterator[SequenceOutput]]:
    """Start len(prompts) x n sequences; errors that concern the request (400/503) surface here."""
    from tokenspeed.runtime.entrypoints.openai.constraints import check_constraints

    await check_constraints(state, params)
    gens = []
    try:
        for p, ids in enumerate(prompts):
            for i in range(n):
                index = p * n + i
                sub_rid = rid if len(prompts) * n == 1 else f"{rid}-{index}"
                gen = state.llm.generate(ids, sequence_params(params, i), rid=sub_rid, stream=stream)
                # Run the generator to its first await: validation happens now, the request is sent now.
                first = asyncio.ensure_future(gen.__anext__())
                gens.append(_Primed(gen, first))
                if index % _ITEMS_PER_TURN == _ITEMS_PER_TURN - 1:
                    await asyncio.sleep(0)  # the sequences started so far are submitted meanwhile
        for g in gens:
            await g.ready()
    except BaseException:
        for g in gens:
            await g.aclose()
        raise
    return gens


class _Primed:
    """An async iterator whose first item is already being awaited (so the request is submitted)."""

    def __init__(self, gen: AsyncIterator[SequenceOutput], first: asyncio.Future) -> None:
        self._gen = gen
        self._first: asyncio.Future | None = first

    async def ready(self) -> None:
        # Surface an immediate failure (bad request, unavailable) without waiting for tokens.
        await asyncio.sleep(0)
        if self._first is not None and self._first.done() and self._first.exception() is not None:
            raise self._first.exception()

    def __aiter__(self):
        return self

    async def __anext__(self) -> SequenceOutput:
        if self._first is not None:
            first, self._first = self._first, None
            return await first
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if self._first is not None and not self._first.done():
            self._first.cancel()
            try:
                await self._first
            except (asyncio.CancelledError, StopAsyncIteration, Exception):
                pass
        self._first = None
        try:
            await self._gen.aclose()
        except RuntimeError:
            pass  # still being iterated elsewhere; that iteration's own exit aborts the request


async def merge(gens: list[AsyncIterator[SequenceOutput]]) -> AsyncIterator[tuple[int, SequenceOutput]]:
    """Interleave several sequences' outputs as they come; closing the merge closes (aborts) them all."""
    if len(gens) == 1:
        try:
            async for out in gens[0]:
                yield 0, out
        finally:
            await gens[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[SequenceOutput]) -> None:
        try:
            async for out in gen:
                await queue.put((i, out, None))
        except Exception as exc:
            await queue.put((i, None, exc))
        finally:
            await queue.put((i, None, StopAsyncIteration()))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    live = len(gens)
    try:
        while live:
            i, out, exc = await queue.get()
            if isinstance(exc, StopAsyncIteration):
                live -= 1
            elif exc is not None:
                raise exc
            else:
                yield i, out
    finally:
        for t in tasks:
            t.cancel()
        # A generator cannot be closed while a pump task is still inside it.
        await asyncio.gather(*tasks, return_exceptions=True)
        for g in gens:
            await g.aclose()  # type: ignore[attr-defined]


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`, cancelling it (which aborts its sequences) if the client goes away meanwhile."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected")
    finally:
        if not task.done():
            task.cancel()
