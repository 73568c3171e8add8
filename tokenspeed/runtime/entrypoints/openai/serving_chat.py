"""POST /v1/chat/completions, its whole pipeline: request -> prompt -> sequences -> render.

`ChatPipeline.prepare` checks the request and applies the chat template (a 400 names what is wrong);
`serving_flow.serve_pipeline` runs the sequences; `body` and `events` render them as OpenAI's
chat.completion object or its chat.completion.chunk stream (tool calls and reasoning shaped by
`ChoiceOutput`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenspeed.runtime.entrypoints.openai import legacy_functions
from tokenspeed.runtime.entrypoints.openai.chat_output import ChoiceOutput
from tokenspeed.runtime.entrypoints.openai.errors import bad_request
from tokenspeed.runtime.entrypoints.openai.logprob_format import chat_entries, vllm_prompt_logprobs
from tokenspeed.runtime.entrypoints.openai.protocol import ChatCompletionRequest, usage
from tokenspeed.runtime.entrypoints.openai.serving_common import (
    check_logprobs,
    check_model,
    failure_error,
    merge,
    now,
    translate_errors,
)
from tokenspeed.runtime.entrypoints.openai.serving_flow import (
    CollectedSequence,
    Pipeline,
    Sequences,
    response_body,
    serve_pipeline,
)
from tokenspeed.runtime.entrypoints.openai.tool_parsers.tool_choice import ToolPlan, plan_tools
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.runtime.grammar.reasoning_first import defer_past_reasoning


def _logprob_entries(
    state: ServerState, ids: list[int], logprobs: list[float] | None, tops: list | None = None
) -> list[dict[str, Any]]:
    return chat_entries(state.tokenizer, ids, logprobs, tops)


# Arguments of apply_chat_template that would change what it returns rather than reach the template.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation", "messages", "tools", "chat_template", "tokenize", "add_generation_prompt", "padding",
        "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)  # fmt: skip


async def _prepare(
    state: ServerState, req: ChatCompletionRequest
) -> tuple[str, list[int], Any, ToolPlan | None]:
    model = check_model(state, req.model)
    try:
        req.check_supported()
        check_logprobs(state, req.logprobs)
        tools, tool_choice = legacy_functions.as_tools(
            req.functions, req.function_call, req.tools, req.tool_choice
        )
        parallel = req.parallel_tool_calls and req.functions is None  # the legacy API makes one call
        plan = plan_tools(tools, tool_choice, parallel, state.server_args.tool_call_parser)
        response_format = req.response_format
        if plan is not None and plan.schema is not None:
            # required / named: the answer is held to the tools' JSON schema by the grammar backend
            if state.server_args.grammar_backend == "none":
                raise bad_request(
                    f"tool_choice: {plan.mode if plan.mode == 'required' else 'a named function'} is enforced by "
                    "structured output; start the server with --grammar-backend xgrammar (or llguidance)",
                    param="tool_choice",
                )
            if response_format or any(v is not None for v in req.constraint_fields().values()):
                raise bad_request(
                    "tool_choice: a required or named tool choice already constrains the answer; drop "
                    "response_format / guided_* or use tool_choice auto",
                    param="tool_choice",
                )
            response_format = {"type": "json_schema", "json_schema": {"name": "tools", "schema": plan.schema}}
        if state.tokenizer is None:
            raise bad_request(
                "this server was started with --skip-tokenizer-init: use /v1/completions with token ids"
            )
        template_kwargs = dict(req.chat_template_kwargs or {})
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & set(template_kwargs))
        if reserved:
            raise bad_request(
                f"chat_template_kwargs: {reserved} are set by the server; leave them out",
                param="chat_template_kwargs",
            )
        add_generation_prompt = req.add_generation_prompt
        if req.continue_final_message:
            _check_continue(req)
            # the template leaves the last message open, and no new turn is started after it
            template_kwargs["continue_final_message"], add_generation_prompt = True, False
        params = req.sampling_params(
            req.max_new_tokens(),
            state.preferred_sampling_params,
            req.logprobs,
            top_logprobs=req.top_logprobs or 0,
            response_format=response_format,
            prompt_logprobs=req.prompt_logprobs,
        )
        args = state.server_args
        if (
            reasoning_parser(state, req)
            and params.json_schema is not None
            and args.grammar_backend == "llguidance"
        ):
            # its grammar would hold the reasoning section to the schema too
            raise bad_request(
                "json_schema: holding the answer after the reasoning section (--reasoning-parser) needs "
                "--grammar-backend xgrammar; or turn thinking off (chat_template_kwargs enable_thinking false)",
                param="response_format",
            )
        if (
            reasoning_parser(state, req)
            and params.json_schema is not None
            and args.grammar_backend == "xgrammar"
        ):
            # the schema holds the answer, not the <think> section before it
            params.ebnf = defer_past_reasoning(
                reasoning_parser(state, req), params.json_schema, not args.disable_any_whitespace
            )
            params.json_schema = None
        ids = await state.llm.prompts.encode_chat(
            req.template_messages(),
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **template_kwargs,
        )
    except (ValueError, TypeError) as exc:
        raise translate_errors(exc if isinstance(exc, ValueError) else ValueError(str(exc))) from exc
    return model, ids, params, plan


def _check_continue(req: ChatCompletionRequest) -> None:
    if req.messages[-1].role != "assistant":
        raise bad_request(
            "continue_final_message: the last message must be the assistant's, whose text is continued",
            param="continue_final_message",
        )
    if "add_generation_prompt" in req.model_fields_set and req.add_generation_prompt:
        raise bad_request(
            "continue_final_message: continuing the last message starts no new turn; set "
            "add_generation_prompt false (or leave it out)",
            param="add_generation_prompt",
        )


def _echo(req: ChatCompletionRequest) -> str:
    """What chat `echo` puts before the answer: the last message, when it is the assistant's (vLLM's)."""
    last = req.messages[-1]
    if not req.echo or last.role != "assistant":
        return ""
    return req.template_messages()[-1]["content"]


def reasoning_parser(state: ServerState, req: ChatCompletionRequest) -> str | None:
    """--reasoning-parser, unless the request turns thinking off (Qwen3's chat_template_kwargs
    enable_thinking: false, which vLLM and SGLang honour the same way)."""
    if (req.chat_template_kwargs or {}).get("enable_thinking") is False:
        return None
    return state.server_args.reasoning_parser


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, request: Request
) -> Response:
    return await serve_pipeline(state, request, await ChatPipeline.prepare(state, req))


@dataclass(kw_only=True)
class ChatPipeline(Pipeline):
    id_prefix = "chatcmpl"
    path = "/v1/chat/completions"

    req: ChatCompletionRequest
    plan: ToolPlan | None  # how tool calls are read from the answer (None without tools)
    echo: str = ""  # chat echo: the last assistant message, before each answer

    @classmethod
    async def prepare(cls, state: ServerState, req: ChatCompletionRequest) -> ChatPipeline:
        """request -> prompt: a 400 (APIError) for anything the request gets wrong."""
        model, ids, params, plan = await _prepare(state, req)
        return cls(
            state=state,
            req=req,
            model=model,
            prompts=[ids],
            params=params,
            plan=plan,
            echo=_echo(req),
        )

    def _shaper(self) -> ChoiceOutput:
        return ChoiceOutput(
            reasoning_parser(self.state, self.req), self.plan, self.state.server_args.tool_call_parser
        )

    @property
    def _legacy(self) -> bool:
        return self.req.functions is not None

    def _message(self, shaper: ChoiceOutput, text: str) -> dict[str, Any]:
        msg = shaper.message(text)
        if self.echo:
            msg["content"] = self.echo + (msg["content"] or "")
        return legacy_functions.message(msg) if self._legacy else msg

    def _finish(self, shaper: ChoiceOutput, reason: str | None) -> str | None:
        reason = shaper.finish_reason(reason)
        return legacy_functions.finish_reason(reason) if self._legacy else reason

    def _deltas(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self._legacy:
            return deltas
        return [d for d in map(legacy_functions.delta, deltas) if d is not None]

    def _logprobs(self, ids: list[int], logprobs: list[float] | None, tops: list | None) -> dict | None:
        if not self.req.logprobs:
            return None
        return {"content": _logprob_entries(self.state, ids, logprobs, tops)}

    def body(self, sequences: list[CollectedSequence]) -> dict[str, Any]:
        choices, prompt_tokens, completion, cached = [], 0, 0, 0
        for i, seq in enumerate(sequences):
            out = seq.final
            prompt_tokens, cached = out.prompt_tokens, max(cached, out.cached_tokens)
            completion += out.completion_tokens
            shaper = self._shaper()
            choices.append(
                {
                    "index": i,
                    "message": self._message(shaper, seq.text),
                    "logprobs": self._logprobs(seq.token_ids, seq.logprobs, seq.top_logprobs),
                    "finish_reason": self._finish(shaper, out.finish_reason),
                    "matched_stop": out.matched_stop,
                }
            )
        usage_obj = usage(prompt_tokens, completion, cached if self.cache_report else None)
        body = response_body(self.rid, "chat.completion", now(), self.model, choices, usage_obj)
        if self.req.prompt_logprobs is not None:
            # vLLM's place for them: the response's, one prompt for every choice
            entries = sequences[0].prompt_logprobs
            body["prompt_logprobs"] = (
                None
                if entries is None
                else vllm_prompt_logprobs(
                    self.state.tokenizer, self.prompts[0], entries, self.req.prompt_logprobs
                )
            )
        return body

    def _chunk(self, choices: list[dict[str, Any]], usage_obj: dict[str, Any] | None = None) -> str:
        return self.chunk("chat.completion.chunk", choices, usage_obj)

    async def events(self, gens: Sequences) -> AsyncIterator[str]:
        req, chunk = self.req, self._chunk
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        n = len(gens)
        shapers = [self._shaper() for _ in range(n)]
        completion = [0] * n
        prompt_tokens, cached = 0, 0
        for i in range(n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": self.echo}, "logprobs": None,
                          "finish_reason": None}])  # fmt: skip
        failure = None
        async for i, out in merge(gens):
            failure = failure or out.failure
            completion[i] = out.completion_tokens
            prompt_tokens, cached = out.prompt_tokens, max(cached, out.cached_tokens)
            deltas = shapers[i].delta(out.text) if out.text else []
            if out.finished:
                deltas += shapers[i].end()
            deltas = self._deltas(deltas)
            # one chunk per delta (a tool call's head and arguments are separate deltas); logprobs ride on
            # the last one, and an output that shows nothing yet still reports its logprobs and finish
            if not deltas and (out.finished or (req.logprobs and out.token_ids)):
                deltas = [{}]
            for delta in deltas[:-1]:
                yield chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
            if deltas:
                choice = {
                    "index": i,
                    "delta": deltas[-1],
                    "logprobs": self._logprobs(out.token_ids, out.logprobs, out.top_logprobs),
                    "finish_reason": self._finish(shapers[i], out.finish_reason) if out.finished else None,
                }
                if out.finished:
                    choice["matched_stop"] = out.matched_stop
                running = usage(prompt_tokens, sum(completion), None) if continuous else None
                yield chunk([choice], running)
        if include_usage:
            yield chunk([], usage(prompt_tokens, sum(completion), cached if self.cache_report else None))
        if failure is not None:
            # After the choice that says "abort"/"error": the cause, as vLLM sends it (the openai client
            # raises it as an APIError).
            yield failure_error(failure).sse()
