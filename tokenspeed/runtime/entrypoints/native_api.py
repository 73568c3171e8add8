"""POST /generate: the native API in SGLang's shape.

Request: `text` or `input_ids` (one prompt or a batch), `sampling_params` (SamplingParams fields:
`max_new_tokens`, `temperature`, ...; one dict or one per prompt), `stream`, optional `rid`,
`return_logprob` (with `top_logprobs_num` alternatives, and `logprob_start_len` >= 0 for the prompt's
logprobs from that token on: `input_token_logprobs`, `input_top_logprobs`). Answer per sequence: `text`, `output_ids`, `meta_info` (`id`, `finish_reason`,
`prompt_tokens`, `completion_tokens`, `cached_tokens`, `e2e_latency`, `queue_time` once scheduled). Streaming sends cumulative `text`
(and cumulative `output_ids`, or only the new ones with `--stream-output`) as server-sent events.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.engine.async_llm import SequenceOutput
from tokenspeed.runtime.entrypoints.admission import admit
from tokenspeed.runtime.entrypoints.openai.errors import APIError, bad_request, field_of
from tokenspeed.runtime.entrypoints.openai.logprob_format import finite_logprob, input_logprobs
from tokenspeed.runtime.entrypoints.openai.serving_common import (
    SSE_DONE,
    check_logprobs,
    failure_error,
    first_failure,
    merge,
    new_id,
    sse,
    start_sequences,
    tokenize,
    tokenize_all,
    translate_errors,
    unless_disconnected,
)
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.runtime.entrypoints.streaming import DisconnectAwareStream, closer
from tokenspeed.sampling_params import SamplingParams

_MAX_N = 128  # sequences per prompt, as /v1/completions allows

_INT, _NUM, _BOOL, _STR = {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "string"}
_SAMPLING_SCHEMA = {
    "type": "object",
    "properties": {
        **dict.fromkeys(("max_new_tokens", "min_new_tokens", "top_k", "seed", "n"), _INT),
        **dict.fromkeys(
            ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"),
            _NUM,
        ),
        **dict.fromkeys(("ignore_eos", "skip_special_tokens"), _BOOL),
        "stop": {"anyOf": [_STR, {"type": "array", "items": _STR}]},
        "stop_token_ids": {"type": "array", "items": _INT},
    },
}
# The body of POST /generate in /openapi.json (the handler reads it by hand: one prompt or a batch).
GENERATE_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "text": {"anyOf": [_STR, {"type": "array", "items": _STR, "minItems": 1}]},
                        "input_ids": {
                            "anyOf": [
                                {"type": "array", "items": _INT, "minItems": 1},
                                {"type": "array", "items": {"type": "array", "items": _INT}, "minItems": 1},
                            ]
                        },
                        "sampling_params": {
                            "anyOf": [_SAMPLING_SCHEMA, {"type": "array", "items": _SAMPLING_SCHEMA}]
                        },
                        "stream": _BOOL,
                        "rid": {"anyOf": [_STR, {"type": "array", "items": _STR}]},
                        "return_logprob": _BOOL,
                        "top_logprobs_num": _INT,
                        "logprob_start_len": _INT,
                    },
                }
            }
        },
    }
}


def finish_reason_obj(out: SequenceOutput) -> dict[str, Any] | None:
    if not out.finished:
        return None
    if out.finish_reason == "length":
        return {"type": "length", "length": out.completion_tokens}
    if out.failure is not None:
        # Cut short by the server (SGLang's shape, with the status the client would get): never "stop".
        return {"type": out.failure.finish_reason, "message": out.failure.message,
                "status_code": out.failure.status}  # fmt: skip
    if out.finish_reason in ("abort", "error"):
        return {"type": "abort", "message": "aborted"}
    return {"type": "stop", "matched": out.matched_stop}


def _prompt_count(body: dict[str, Any]) -> int:
    """How many prompts `_prompts` will find (a malformed body is reported by `_prompts` itself)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        return max(1, len(text))
    if isinstance(input_ids, list) and input_ids and all(isinstance(t, list) for t in input_ids):
        return len(input_ids)
    return 1


async def _prompts(state: ServerState, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise bad_request("send exactly one of `text` or `input_ids`", param="text")
    if text is not None:
        if isinstance(text, str):
            return [await tokenize(state, text, "text")], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return await tokenize_all(state, text, "text"), True
        raise bad_request("text must be a string or a non-empty list of strings", param="text")
    if isinstance(input_ids, list) and input_ids and all(isinstance(t, int) for t in input_ids):
        return [await tokenize(state, list(input_ids), "input_ids")], False
    if isinstance(input_ids, list) and input_ids and all(isinstance(t, list) for t in input_ids):
        return await tokenize_all(state, [list(t) for t in input_ids], "input_ids"), True
    raise bad_request("input_ids must be a list of token ids or a list of such lists", param="input_ids")


def _params(state: ServerState, body: dict[str, Any], count: int) -> list[SamplingParams]:
    raw = body.get("sampling_params") or {}
    raws = raw if isinstance(raw, list) else [raw] * count
    if len(raws) != count or not all(isinstance(r, dict) for r in raws):
        raise bad_request(
            "sampling_params must be an object or one object per prompt", param="sampling_params"
        )
    want_logprobs = _flag(body, "return_logprob")
    check_logprobs(state, want_logprobs)
    out = []
    for r in raws:
        values = {**(state.preferred_sampling_params or {}), **r}
        values = {k: v for k, v in values.items() if k in SamplingParams.__dataclass_fields__ or k in r}
        values["logprobs"] = want_logprobs
        if want_logprobs and body.get("top_logprobs_num"):
            values["top_logprobs"] = body["top_logprobs_num"]
        start = body.get("logprob_start_len", -1)
        if want_logprobs and not (isinstance(start, int) and not isinstance(start, bool) and start >= -1):
            raise bad_request(
                f"logprob_start_len must be -1 (output logprobs only) or a prompt position, got {start!r}",
                param="logprob_start_len",
            )
        if want_logprobs and start >= 0:
            # SGLang's input logprobs: the prompt's, from token `start` on
            values["prompt_logprobs"] = body.get("top_logprobs_num") or 0
            values["logprob_start_len"] = start
        try:
            p = SamplingParams.from_dict(values)
            p.verify()
            if p.n > _MAX_N:
                raise ValueError(f"n must be between 1 and {_MAX_N}, got {p.n}")
            if p.max_new_tokens is not None and p.min_new_tokens > p.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens must be at most max_new_tokens ({p.max_new_tokens}), got {p.min_new_tokens}"
                )
        except (TypeError, ValueError) as exc:
            field = field_of(str(exc))
            raise bad_request(
                f"sampling_params: {exc}", param=f"sampling_params.{field}" if field else "sampling_params"
            ) from exc
        out.append(p)
    return out


def _flag(body: dict[str, Any], name: str) -> bool:
    """A true/false field, strictly: `"yes"` or 1 is a 400, not a guess."""
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, got {value!r}", param=name)
    return value


# What /generate reads; SGLang's other fields (lora_path, return_text_in_logprobs, image_data,
# custom_logit_processor, ...) are refused by name rather than dropped.
_BODY_FIELDS = frozenset(
    {"text", "input_ids", "sampling_params", "stream", "rid", "return_logprob", "top_logprobs_num",
     "logprob_start_len"}
)  # fmt: skip


async def generate(state: ServerState, body: dict[str, Any], request: Request) -> Response:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - _BODY_FIELDS)
    if unknown:
        raise bad_request(
            f"{unknown[0]}: not supported by this server's /generate (it reads {', '.join(sorted(_BODY_FIELDS))})",
            param=unknown[0],
        )
    # Parameters first: a mistake there is answered before any prompt is tokenized.
    params = _params(state, body, _prompt_count(body))
    try:
        prompts, batched = await _prompts(state, body)
    except ValueError as exc:  # text or ids the context cannot hold, invalid text: a 400 naming the field
        raise translate_errors(exc) from exc
    stream = _flag(body, "stream")
    rids = body.get("rid")
    if rids is not None and not (
        isinstance(rids, str) or (isinstance(rids, list) and all(isinstance(r, str) and r for r in rids))
    ):
        raise bad_request("rid must be a string or a list of strings", param="rid")
    base_rid = rids if isinstance(rids, str) else new_id("gen")
    admit(state, sum(p.n for p in params), sum(len(ids) * p.n for ids, p in zip(prompts, params, strict=True)))
    gens = []
    gen_prompts: list[tuple[list[int], int]] = []  # per sequence, its prompt's token ids, logprob_start_len
    try:
        for k, (ids, p) in enumerate(zip(prompts, params, strict=True)):
            rid = (
                rids[k]
                if isinstance(rids, list) and k < len(rids)
                else (base_rid if not batched else f"{base_rid}-{k}")
            )
            n, p.n = p.n, 1
            gens.extend(await start_sequences(state, [ids], p, n, rid, stream))
            gen_prompts.extend([(ids, p.logprob_start_len)] * n)
    except Exception as exc:
        await closer(gens)()
        raise translate_errors(exc) from exc
    started = time.time()
    if stream:
        return DisconnectAwareStream(_stream(state, gens, gen_prompts, started), closer(gens))
    try:
        results = await unless_disconnected(request, _collect(gens, gen_prompts, started))
    finally:
        await closer(gens)()
    if len(results) == 1 and not batched:
        return JSONResponse(results[0])
    return JSONResponse(results)


def _meta(
    out: SequenceOutput,
    started: float,
    logprobs: list[float] | None,
    tops: list | None = None,
    prompt: tuple[list[int], list, int] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": finish_reason_obj(out),
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "cached_tokens": out.cached_tokens,
        "e2e_latency": time.time() - started,
        "dp_rank": out.dp_rank,
    }
    if out.queue_time is not None:
        meta["queue_time"] = out.queue_time  # the same split as request_queue_time_seconds
    if logprobs is not None:
        meta["output_token_logprobs"] = [finite_logprob(lp) for lp in logprobs]
    if tops is not None:
        # SGLang's spelling: per output token, [logprob, token id, text (not sent)] most likely first
        meta["output_top_logprobs"] = [[[finite_logprob(lp), int(t), None] for t, lp in alts] for alts in tops]
    if prompt is not None:
        meta.update(input_logprobs(*prompt))
    return meta


async def _collect(gens, gen_prompts: list[tuple[list[int], int]], started: float) -> list[dict[str, Any]]:
    n = len(gens)
    texts: list[list[str]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float] | None] = [None] * n
    tops: list[list | None] = [None] * n
    prompt: list[tuple[list[int], list, int] | None] = [None] * n
    final: list[Any] = [None] * n
    async for i, out in merge(gens):
        if out.prompt_logprobs is not None:
            prompt[i] = (gen_prompts[i][0], out.prompt_logprobs, gen_prompts[i][1])
        texts[i].append(out.text)
        ids[i].extend(out.token_ids)
        if out.logprobs is not None:
            lps[i] = (lps[i] or []) + out.logprobs
        if out.top_logprobs is not None:
            tops[i] = (tops[i] or []) + out.top_logprobs
        if out.finished:
            final[i] = out
    failure = first_failure(final)
    if failure is not None:
        raise failure_error(failure)  # a cut-off answer is an error, never a 200 that looks complete
    results = []
    for i, out in enumerate(final):
        results.append(
            {
                "text": "".join(texts[i]),
                "output_ids": ids[i],
                "meta_info": _meta(out, started, lps[i], tops[i], prompt[i]),
            }
        )
    return results


async def _stream(state: ServerState, gens, gen_prompts: list[tuple[list[int], int]], started: float):
    incremental = state.server_args.stream_output
    n = len(gens)
    texts = [""] * n
    ids: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float] | None] = [None] * n
    prompt: list[tuple[list[int], list, int] | None] = [None] * n
    failure = None
    try:
        async for i, out in merge(gens):
            failure = failure or out.failure
            if out.prompt_logprobs is not None:
                prompt[i] = (gen_prompts[i][0], out.prompt_logprobs, gen_prompts[i][1])
            texts[i] += out.text
            ids[i].extend(out.token_ids)
            if out.logprobs is not None:
                lps[i] = (lps[i] or []) + out.logprobs
            body = {
                "index": i,
                "text": texts[i],
                "output_ids": list(out.token_ids) if incremental else list(ids[i]),
                "meta_info": _meta(out, started, lps[i], prompt=prompt[i]),
            }
            yield sse(body)
    except APIError as exc:
        yield exc.sse()
    except Exception as exc:
        yield translate_errors(exc).sse()
    if failure is not None:
        yield failure_error(failure).sse()  # after the event whose finish_reason says abort/error
    yield SSE_DONE
