"""POST /v1/completions, its whole pipeline: request -> prompt -> sequences -> render.

One or many prompts (text or token ids), n sequences each. `CompletionPipeline.prepare` checks the request
and tokenizes its prompts (a 400 names what is wrong); `serving_flow.serve_pipeline` runs the sequences;
`body` and `events` render them as OpenAI's text_completion object or stream (echo, logprobs, token ids).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenspeed.runtime.entrypoints.openai.errors import APIError
from tokenspeed.runtime.entrypoints.openai.logprob_format import (
    completion_logprobs,
    completion_prompt_logprobs,
    joined,
    vllm_prompt_logprobs,
)
from tokenspeed.runtime.entrypoints.openai.protocol import CompletionRequest, usage
from tokenspeed.runtime.entrypoints.openai.serving_common import (
    check_logprobs,
    check_model,
    failure_error,
    merge,
    tokenize_all,
    translate_errors,
)
from tokenspeed.runtime.entrypoints.openai.serving_flow import (
    CollectedSequence,
    Pipeline,
    Sequences,
    response_body,
    serve_pipeline,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState


def _logprobs(
    state: ServerState, ids: list[int], lps: list[float] | None, offset: int, tops: list | None = None
) -> dict[str, Any] | None:
    return completion_logprobs(state.tokenizer, ids, lps, tops, offset)


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    return await serve_pipeline(state, request, await CompletionPipeline.prepare(state, req))


def _echo_text(state: ServerState, prompt: str | list[int], ids: list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    return state.tokenizer.decode(ids) if state.tokenizer is not None else ""


@dataclass(kw_only=True)
class CompletionPipeline(Pipeline):
    id_prefix = "cmpl"
    path = "/v1/completions"

    req: CompletionRequest
    echo_texts: list[str]  # per prompt: what `echo` puts before its sequences' text ("" without echo)
    want_logprobs: bool

    @classmethod
    async def prepare(cls, state: ServerState, req: CompletionRequest) -> CompletionPipeline:
        """request -> prompts: a 400 (APIError) for anything the request gets wrong."""
        model = check_model(state, req.model)
        want_logprobs = req.logprobs is not None
        try:
            req.check_supported()
            check_logprobs(state, want_logprobs)
            prompts = req.prompts()
            params = req.sampling_params(
                req.max_tokens,
                state.preferred_sampling_params,
                want_logprobs,
                top_logprobs=req.logprobs or 0,
                prompt_logprobs=req.prompt_logprobs_wanted(),
            )
            prompt_ids = await tokenize_all(state, prompts)
        except APIError:
            raise
        except (ValueError, TypeError) as exc:
            raise translate_errors(exc if isinstance(exc, ValueError) else ValueError(str(exc))) from exc
        echo_texts = [
            _echo_text(state, p, ids) if req.echo else "" for p, ids in zip(prompts, prompt_ids, strict=True)
        ]
        return cls(
            state=state,
            req=req,
            model=model,
            prompts=prompt_ids,
            params=params,
            echo_texts=echo_texts,
            want_logprobs=want_logprobs,
        )

    def prompt_of(self, index: int) -> int:
        return index // self.req.n

    def _logprobs(
        self, ids: list[int], lps: list[float] | None, offset: int, tops: list | None
    ) -> dict[str, Any] | None:
        return _logprobs(self.state, ids, lps if self.want_logprobs else None, offset, tops)

    def _with_prompt(self, p: int, lp: dict[str, Any] | None, entries: list | None) -> dict[str, Any] | None:
        """With echo and logprobs, the prompt's logprobs (OpenAI's shape) before the completion's."""
        if not (self.req.echo and self.want_logprobs) or entries is None:
            return lp
        tok = self.state.tokenizer
        return joined(completion_prompt_logprobs(tok, self.prompts[p], entries, self.req.logprobs or 0), lp)

    def _vllm_prompt(self, p: int, entries: list | None) -> list | None:
        if self.req.prompt_logprobs is None or entries is None:
            return None
        return vllm_prompt_logprobs(self.state.tokenizer, self.prompts[p], entries, self.req.prompt_logprobs)

    def body(self, sequences: list[CollectedSequence]) -> dict[str, Any]:
        choices, prompt_tokens, completion, cached = [], 0, 0, 0
        seen_prompts: set[int] = set()
        for i, seq in enumerate(sequences):
            out = seq.final
            p = self.prompt_of(i)
            if p not in seen_prompts:
                seen_prompts.add(p)
                prompt_tokens += out.prompt_tokens
                cached += out.cached_tokens
            completion += out.completion_tokens
            echo = self.echo_texts[p]
            lp = self._logprobs(seq.token_ids, seq.logprobs, len(echo), seq.top_logprobs)
            choices.append(
                {
                    "index": i,
                    "text": echo + seq.text,
                    "logprobs": self._with_prompt(p, lp, seq.prompt_logprobs),
                    "finish_reason": out.finish_reason,
                    "matched_stop": out.matched_stop,
                }
            )
            if self.req.prompt_logprobs is not None:
                choices[-1]["prompt_logprobs"] = self._vllm_prompt(p, seq.prompt_logprobs)
            if self.state.tokenizer is None:
                # --skip-tokenizer-init: no text can be made, so the answer is its token ids (SGLang's
                # output_ids)
                choices[-1]["token_ids"] = list(seq.token_ids)
        usage_obj = usage(prompt_tokens, completion, cached if self.cache_report else None)
        return response_body(self.rid, "text_completion", self.created, self.model, choices, usage_obj)

    def _chunk(self, choices: list[dict[str, Any]], usage_obj: dict[str, Any] | None = None) -> str:
        return self.chunk("text_completion", choices, usage_obj)

    async def events(self, gens: Sequences) -> AsyncIterator[str]:
        req = self.req
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        n = len(gens)
        completion = [0] * n
        prompt_tokens: dict[int, int] = {}
        cached: dict[int, int] = {}
        offsets = [0] * n  # where each choice's next text starts in its whole text (the echo included)
        started = [False] * n
        failure = None
        async for i, out in merge(gens):
            failure = failure or out.failure
            p = self.prompt_of(i)
            completion[i] = out.completion_tokens
            prompt_tokens[p], cached[p] = out.prompt_tokens, out.cached_tokens
            text = out.text
            first = not started[i]
            if first:
                started[i] = True
                text = self.echo_texts[p] + text
            ids_only = self.state.tokenizer is None  # --skip-tokenizer-init: each chunk carries its token ids
            if not text and not out.finished and not (ids_only and out.token_ids):
                continue
            start = offsets[i] + (len(self.echo_texts[p]) if first else 0)
            lp = self._logprobs(out.token_ids, out.logprobs, start, out.top_logprobs)
            if first:
                lp = self._with_prompt(p, lp, out.prompt_logprobs)
            offsets[i] += len(text)
            choice = {
                "index": i,
                "text": text,
                "logprobs": lp,
                "finish_reason": out.finish_reason if out.finished else None,
            }
            if ids_only:
                choice["token_ids"] = list(out.token_ids)
            yield self._chunk([choice])
        if include_usage:
            u = usage(
                sum(prompt_tokens.values()),
                sum(completion),
                sum(cached.values()) if self.cache_report else None,
            )
            yield self._chunk([], u)
        if failure is not None:
            yield failure_error(failure).sse()  # after the choice that says "abort"/"error": the cause
