"""POST /v1/completions: one or many prompts (text or token ids), n sequences each."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenspeed.runtime.entrypoints.openai.errors import APIError
from tokenspeed.runtime.entrypoints.openai.logprob_format import completion_logprobs
from tokenspeed.runtime.entrypoints.openai.protocol import CompletionRequest, usage
from tokenspeed.runtime.entrypoints.openai.serving_common import (
    check_logprobs,
    check_model,
    failure_error,
    first_failure,
    merge,
    new_id,
    now,
    sse,
    tokenize,
    translate_errors,
)
from tokenspeed.runtime.entrypoints.openai.serving_flow import (
    cache_report_enabled,
    collect_sequences,
    respond,
    response_body,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState


def _logprobs(
    state: ServerState, ids: list[int], lps: list[float] | None, offset: int, tops: list | None = None
) -> dict[str, Any] | None:
    return completion_logprobs(state.tokenizer, ids, lps, tops, offset)


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    model = check_model(state, req.model)
    want_logprobs = req.logprobs is not None
    try:
        req.check_supported()
        check_logprobs(state, want_logprobs)
        prompts = req.prompts()
        params = req.sampling_params(
            req.max_tokens, state.preferred_sampling_params, want_logprobs, top_logprobs=req.logprobs or 0
        )
        prompt_ids = [await tokenize(state, p) for p in prompts]
    except APIError:
        raise
    except (ValueError, TypeError) as exc:
        raise translate_errors(exc if isinstance(exc, ValueError) else ValueError(str(exc))) from exc
    echo_texts = [
        _echo_text(state, p, ids) if req.echo else "" for p, ids in zip(prompts, prompt_ids, strict=True)
    ]
    rid = req.rid or new_id("cmpl")
    ctx = _Ctx(state, req, model, rid, echo_texts, cache_report_enabled(state), want_logprobs)
    return await respond(
        state,
        request,
        prompt_ids,
        params,
        req.n,
        rid,
        req.stream,
        events=lambda gens: _stream(ctx, gens),
        collect=lambda gens: _collect(ctx, gens),
    )


def _echo_text(state: ServerState, prompt: str | list[int], ids: list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    return state.tokenizer.decode(ids) if state.tokenizer is not None else ""


class _Ctx:
    def __init__(self, state, req, model, rid, echo_texts, cache_report, want_logprobs) -> None:
        self.state, self.req, self.model, self.rid = state, req, model, rid
        self.echo_texts, self.cache_report, self.want_logprobs = echo_texts, cache_report, want_logprobs
        self.created = now()

    def prompt_of(self, index: int) -> int:
        return index // self.req.n


async def _collect(ctx: _Ctx, gens) -> dict[str, Any]:
    choices, prompt_tokens, completion, cached = [], 0, 0, 0
    seen_prompts: set[int] = set()
    sequences = await collect_sequences(gens)
    failure = first_failure([seq.final for seq in sequences])
    if failure is not None:
        raise failure_error(failure)  # a cut-off answer is an error, never a 200 that looks complete
    for i, seq in enumerate(sequences):
        out = seq.final
        p = ctx.prompt_of(i)
        if p not in seen_prompts:
            seen_prompts.add(p)
            prompt_tokens += out.prompt_tokens
            cached += out.cached_tokens
        completion += out.completion_tokens
        echo = ctx.echo_texts[p]
        choices.append(
            {
                "index": i,
                "text": echo + seq.text,
                "logprobs": _logprobs(
                    ctx.state,
                    seq.token_ids,
                    seq.logprobs if ctx.want_logprobs else None,
                    len(echo),
                    seq.top_logprobs,
                ),
                "finish_reason": out.finish_reason,
                "matched_stop": out.matched_stop,
            }
        )
        if ctx.state.tokenizer is None:
            # --skip-tokenizer-init: no text can be made, so the answer is its token ids (SGLang's output_ids)
            choices[-1]["token_ids"] = list(seq.token_ids)
    usage_obj = usage(prompt_tokens, completion, cached if ctx.cache_report else None)
    return response_body(ctx.rid, "text_completion", ctx.created, ctx.model, choices, usage_obj)


async def _stream(ctx: _Ctx, gens):
    req = ctx.req
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    n = len(gens)
    completion = [0] * n
    prompt_tokens: dict[int, int] = {}
    cached: dict[int, int] = {}
    offsets = [len(ctx.echo_texts[ctx.prompt_of(i)]) for i in range(n)]
    started = [False] * n

    def chunk(choices: list[dict[str, Any]], usage_obj: dict[str, Any] | None = None) -> str:
        return sse(response_body(ctx.rid, "text_completion", ctx.created, ctx.model, choices, usage_obj))

    failure = None
    async for i, out in merge(gens):
        failure = failure or out.failure
        p = ctx.prompt_of(i)
        completion[i] = out.completion_tokens
        prompt_tokens[p], cached[p] = out.prompt_tokens, out.cached_tokens
        text = out.text
        if not started[i]:
            started[i] = True
            text = ctx.echo_texts[p] + text
        ids_only = ctx.state.tokenizer is None  # --skip-tokenizer-init: each chunk carries its token ids
        if not text and not out.finished and not (ids_only and out.token_ids):
            continue
        lp = _logprobs(
            ctx.state, out.token_ids, out.logprobs if ctx.want_logprobs else None, offsets[i], out.top_logprobs
        )
        offsets[i] += len(text)
        choice = {
            "index": i,
            "text": text,
            "logprobs": lp,
            "finish_reason": out.finish_reason if out.finished else None,
        }
        if ids_only:
            choice["token_ids"] = list(out.token_ids)
        yield chunk([choice])
    if include_usage:
        u = usage(
            sum(prompt_tokens.values()),
            sum(completion),
            sum(cached.values()) if ctx.cache_report else None,
        )
        yield chunk([], u)
    if failure is not None:
        yield failure_error(failure).sse()  # after the choice that says "abort"/"error": the cause
