"""Request models of the OpenAI-compatible API and their translation to `SamplingParams`.

Responses are built as plain dicts by the handlers (they are written once per chunk, so building pydantic
objects for them would only cost time). A field this server does not know is refused with a 400 naming
it; OpenAI's newer hint fields that change nothing here are accepted and reported, never silently
(`request_fields.py` lists every field's status).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenspeed.runtime.entrypoints.openai.errors import FieldError
from tokenspeed.runtime.grammar.spec import from_request
from tokenspeed.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False
    # OpenAI's random padding of stream chunks (against length side channels): accepted, not added
    include_obfuscation: bool | None = None

    @field_validator("continuous_usage_stats")
    @classmethod
    def _usage_once(cls, value: bool) -> bool:
        if value:
            # usage is counted once, for the last chunk: a client asking for it on every chunk is told so
            raise ValueError("usage on every chunk is not sent; use include_usage (usage in the last chunk)")
        return value


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its newer spelling of guided decoding): one of json, regex, choice,
    grammar or json_object. Its backend tuning hints are accepted and reported as ignored; a key this
    server cannot enforce (structural_tag) is a 400 naming it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_schema: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None

    def constraint_fields(self) -> dict[str, Any]:
        return {
            "structured_outputs.json": self.json_schema,
            "structured_outputs.regex": self.regex,
            "structured_outputs.choice": self.choice,
            "structured_outputs.grammar": self.grammar,
            "structured_outputs.json_object": self.json_object,
        }


class _SamplingFields(BaseModel):
    """Fields shared by chat and completions (OpenAI's plus the usual engine extensions)."""

    # NaN and Infinity are valid Python JSON but no sampler can use them: refused with a 400 naming the field.
    # A field this server does not know is a 400 naming it (vLLM's extra="forbid"), never silently dropped;
    # OpenAI's informational fields (user, metadata, store) are accepted below and change nothing.
    # Strict types: `stream: "yes"`, `max_tokens: true` or `temperature: "0.5"` is a 400 naming the field,
    # not a guess at what the client meant (an integer is still a number).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    # max_tokens when neither the request nor --preferred-sampling-params sets it (None: up to the context)
    default_max_tokens: ClassVar[int | None] = None

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    # Newer OpenAI fields with nothing to change here: accepted and reported (request_fields.py)
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    rid: str | None = None
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    # Output constraints: vLLM's extra_body spellings and SGLang's (chat adds OpenAI's response_format).
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's extra field: per prompt token its logprob and rank, with this many most likely tokens
    prompt_logprobs: int | None = None

    def check_prompt_logprobs(self) -> None:
        if self.prompt_logprobs is None:
            return
        if not 0 <= self.prompt_logprobs <= 20:
            raise ValueError(f"prompt_logprobs must be between 0 and 20, got {self.prompt_logprobs}")
        if self.stream:
            # as vLLM: they belong to the whole answer, which a stream never sends in one piece
            raise ValueError(
                "prompt_logprobs: not available with stream true; drop stream or prompt_logprobs"
            )

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            # as vLLM: options of a stream that is not sent would be silently ignored
            raise FieldError("stream_options", "stream_options: only with stream true; set stream or drop it")

    def constraint_fields(self) -> dict[str, Any]:
        return {
            "guided_json": self.guided_json,
            "guided_regex": self.guided_regex,
            "guided_choice": self.guided_choice,
            "guided_grammar": self.guided_grammar,
            "regex": self.regex,
            "ebnf": self.ebnf,
            **(self.structured_outputs.constraint_fields() if self.structured_outputs else {}),
        }

    def sampling_params(
        self,
        max_tokens: int | None,
        preferred: dict[str, Any] | None,
        logprobs: bool,
        top_logprobs: int = 0,
        response_format: dict[str, Any] | None = None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """Request fields override `--preferred-sampling-params`, which override the defaults."""
        values: dict[str, Any] = {}
        if preferred:
            values.update({k: v for k, v in preferred.items() if k in SamplingParams.__dataclass_fields__})
        explicit = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
        }
        values.update({k: v for k, v in explicit.items() if v is not None})
        # the request's max_tokens, else --preferred-sampling-params', else the endpoint's default
        if max_tokens is not None:
            values["max_new_tokens"] = max_tokens
        elif "max_new_tokens" not in values:
            values["max_new_tokens"] = self.default_max_tokens
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 16:
            raise ValueError("stop: at most 16 stop strings")
        values.update(
            stop=stop,
            include_stop_str_in_output=self.include_stop_str_in_output,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            min_new_tokens=self.min_tokens,
            logprobs=logprobs,
            top_logprobs=top_logprobs if logprobs else 0,
            logit_bias=self.logit_bias,
            prompt_logprobs=prompt_logprobs,
            n=1,  # the front end fans n out into n sequences
        )
        constraint = from_request(response_format, self.constraint_fields())
        if constraint is not None:
            values[constraint.kind] = constraint.text
        params = SamplingParams.from_dict(values)
        try:
            params.verify()
        except ValueError as exc:
            raise self._in_client_terms(exc) from exc
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise FieldError(
                "min_tokens",
                f"min_tokens ({self.min_tokens}) is more than {self.max_tokens_field()} ({max_tokens}); "
                "lower min_tokens or raise the maximum",
            )
        return params

    def max_tokens_field(self) -> str:
        """The name the client gave its token maximum by."""
        return "max_tokens"

    def _in_client_terms(self, exc: ValueError) -> FieldError:
        """SamplingParams' complaint, naming the field the client sent rather than the engine's own."""
        message = str(exc)
        names = {"max_new_tokens": self.max_tokens_field(), "min_new_tokens": "min_tokens"}
        field = message.split(" ", 1)[0].rstrip(":")
        for engine_name, client_name in names.items():
            if message.startswith(engine_name):
                message, field = client_name + message[len(engine_name) :], client_name
        return FieldError(field, message)

    def check_n(self) -> None:
        if not 1 <= self.n <= 128:
            raise ValueError(f"n must be between 1 and 128, got {self.n}")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the last (assistant) message is continued rather than closed, and echo puts it before
    # the answer
    continue_final_message: bool = False
    echo: bool = False
    # OpenAI's legacy function calling, served as tools (legacy_functions.py)
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # Newer OpenAI fields with nothing to change here: accepted and reported (request_fields.py)
    reasoning_effort: str | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[str] | None = None
    verbosity: str | None = None

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def check_messages(self) -> None:
        """What the chat template would render silently wrong: content missing where only an assistant
        turn that calls tools may go without, a tool result that says not which call it answers."""
        for i, m in enumerate(self.messages):
            if m.content is None and not (m.role == "assistant" and (m.model_extra or {}).get("tool_calls")):
                raise FieldError(
                    f"messages[{i}].content", f"messages[{i}].content: a {m.role} message needs content"
                )
            if m.role == "tool" and not m.tool_call_id:
                raise FieldError(
                    f"messages[{i}].tool_call_id",
                    f"messages[{i}].tool_call_id: a tool message names the call it answers (tool_call_id)",
                )

    def template_messages(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            msg = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                texts = []
                for part in m.content:
                    if part.get("type") != "text":
                        raise ValueError(
                            f"messages: content part type {part.get('type')!r} is not supported; send text parts"
                        )
                    texts.append(str(part.get("text", "")))
                msg["content"] = "".join(texts)
            elif m.content is None:
                msg["content"] = ""
            out.append(msg)
        return out

    def check_supported(self) -> None:
        self.check_n()
        self.check_prompt_logprobs()
        self.check_stream_options()
        self.check_messages()
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be between 0 and 20, got {self.top_logprobs}")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: set logprobs to true as well")


class CompletionRequest(_SamplingFields):
    default_max_tokens: ClassVar[int | None] = 16  # OpenAI's default for completions

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = None
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        self.check_n()
        if self.suffix:
            raise ValueError("suffix: insertion (fill-in-the-middle) is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of: only best_of == n is supported")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        self.check_prompt_logprobs()
        self.check_stream_options()

    def prompt_logprobs_wanted(self) -> int | None:
        """Alternatives per prompt token to compute: vLLM's prompt_logprobs, and with echo and logprobs the
        prompt's scores that OpenAI puts before the completion's (what evaluation harnesses read)."""
        echoed = self.logprobs if self.echo and self.logprobs is not None else None
        given = [n for n in (self.prompt_logprobs, echoed) if n is not None]
        return max(given) if given else None

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt: it is an empty list; send a string, token ids or a list of prompts")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


# The finish_reason of a choice: OpenAI's stop and length, plus "abort" (the client's own, or cut off by a
# shutdown) and "error", as vLLM and SGLang report them. A cut-off answer is never reported as "stop".
FinishReason = Literal["stop", "length", "abort", "error"]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out
