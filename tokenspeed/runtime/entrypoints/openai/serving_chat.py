"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.engine.async_llm import SequenceOutput
from tokenspeed.runtime.engine.tokenizer import apply_chat_template
from tokenspeed.runtime.entrypoints.openai.errors import APIError, bad_request
from tokenspeed.runtime.entrypoints.openai.protocol import ChatCompletionRequest, openai_finish_reason, usage
from tokenspeed.runtime.entrypoints.openai.serving_common import (
    SSE_DONE,
    check_logprobs,
    check_model,
    merge,
    new_id,
    now,
    output_error,
    sse,
    start_sequences,
    translate_errors,
    unless_disconnected,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.runtime.entrypoints.streaming import DisconnectAwareStream, closer


def _logprob_entries(
    state: ServerState, ids: list[int], logprobs: list[float] | None
) -> list[dict[str, Any]]:
    if logprobs is None:
        return []
    tok = state.tokenizer
    out = []
    for tid, lp in zip(ids, logprobs, strict=False):
        text = tok.decode([tid]) if tok is not None else str(tid)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return out


def _prepare(state: ServerState, req: ChatCompletionRequest) -> tuple[str, list[int], Any]:
    model = check_model(state, req.model)
    try:
        req.check_supported()
        check_logprobs(state, req.logprobs)
        if state.tokenizer is None:
            raise bad_request(
                "this server was started with --skip-tokenizer-init: use /v1/completions with token ids"
            )
        ids = apply_chat_template(
            state.tokenizer,
            req.template_messages(),
            add_generation_prompt=req.add_generation_prompt,
            tools=req.tools,
            **(req.chat_template_kwargs or {}),
        )
        params = req.sampling_params(req.max_new_tokens(), state.preferred_sampling_params, req.logprobs)
    except (ValueError, TypeError) as exc:
        raise translate_errors(ValueError(str(exc))) from exc
    return model, ids, params


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, request: Request
) -> Response:
    model, ids, params = _prepare(state, req)
    rid = req.rid or new_id("chatcmpl")
    cache_report = bool(getattr(state.server_args, "enable_cache_report", False))
    try:
        gens = await start_sequences(state, [ids], params, req.n, rid, req.stream)
    except Exception as exc:
        raise translate_errors(exc) from exc
    if req.stream:
        return DisconnectAwareStream(_stream(state, req, model, rid, gens, cache_report), closer(gens))
    try:
        result = await unless_disconnected(request, _collect(state, req, model, rid, gens, cache_report))
    finally:
        await closer(gens)()
    return JSONResponse(result)


async def _collect(state, req, model, rid, gens, cache_report) -> dict[str, Any]:
    n = len(gens)
    texts: list[list[str]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    final: list[SequenceOutput | None] = [None] * n
    async for i, out in merge(gens):
        texts[i].append(out.text)
        ids[i].extend(out.token_ids)
        if out.logprobs:
            lps[i].extend(out.logprobs)
        if out.finished:
            final[i] = out
    choices, prompt_tokens, completion, cached = [], 0, 0, 0
    for i, out in enumerate(final):
        assert out is not None  # merge ends only after every sequence finished
        if out.error and not ids[i]:
            raise output_error(out)
        prompt_tokens, cached = out.prompt_tokens, max(cached, out.cached_tokens)
        completion += out.completion_tokens
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": "".join(texts[i])},
                "logprobs": {"content": _logprob_entries(state, ids[i], lps[i])} if req.logprobs else None,
                "finish_reason": openai_finish_reason(out.finish_reason),
                "matched_stop": out.matched_stop,
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion, cached if cache_report else None),
    }


async def _stream(state, req, model, rid, gens, cache_report):
    created = now()
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

    def chunk(choices: list[dict[str, Any]], usage_obj: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if usage_obj is not None:
            body["usage"] = usage_obj
        return sse(body)

    n = len(gens)
    completion = [0] * n
    prompt_tokens, cached = 0, 0
    for i in range(n):
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])  # fmt: skip
    try:
        async for i, out in merge(gens):
            if out.error and out.completion_tokens == 0:
                yield output_error(out).sse()
                continue
            completion[i] = out.completion_tokens
            prompt_tokens, cached = out.prompt_tokens, max(cached, out.cached_tokens)
            delta = {"content": out.text} if out.text else {}
            if delta or out.finished:
                choice = {
                    "index": i,
                    "delta": delta,
                    "logprobs": (
                        {"content": _logprob_entries(state, out.token_ids, out.logprobs)}
                        if req.logprobs
                        else None
                    ),
                    "finish_reason": openai_finish_reason(out.finish_reason) if out.finished else None,
                }
                if out.finished:
                    choice["matched_stop"] = out.matched_stop
                running = usage(prompt_tokens, sum(completion), None) if continuous else None
                yield chunk([choice], running)
        if include_usage:
            yield chunk([], usage(prompt_tokens, sum(completion), cached if cache_report else None))
    except APIError as exc:
        yield exc.sse()
    except Exception as exc:
        yield translate_errors(exc).sse()
    yield SSE_DONE
