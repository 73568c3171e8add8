"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` with a matching status."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def sse(self) -> str:
        """The error as a server-sent event, for a failure after a stream has started."""
        return f"data: {json.dumps(self.body())}\n\n"


# A message that starts with a field path ("stop: ...", "n must be ...", "tools[0].function.name: ...").
_LEADING_FIELD = re.compile(r"([a-z_]+)((?:\[\d+\]|\.[A-Za-z_]\w*)*)(?::| must | is | and )")
# The request fields (OpenAI's, vLLM's and SGLang's spellings) a message may start with; anything else
# ("the server is ...") names no field.
_REQUEST_FIELDS = frozenset(
    {
        "model", "prompt", "messages", "n", "best_of", "suffix", "echo", "stream", "stream_options",
        "max_tokens", "max_completion_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
        "ignore_eos", "skip_special_tokens", "logprobs", "top_logprobs", "prompt_logprobs", "logit_bias",
        "tools", "tool_choice", "parallel_tool_calls", "response_format", "chat_template_kwargs",
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "regex", "ebnf", "rid", "user",
        "text", "input_ids", "sampling_params", "max_new_tokens", "min_new_tokens", "return_logprob",
        "top_logprobs_num", "logprob_start_len", "json_schema", "tokens",
    }
)  # fmt: skip


def field_of(message: str) -> str | None:
    """The request field a message names first, if it starts with one; else None."""
    match = _LEADING_FIELD.match(message)
    if match is None or match.group(1) not in _REQUEST_FIELDS:
        return None
    return match.group(1) + match.group(2)


class FieldError(ValueError):
    """Bad input in one request field: a 400 whose `param` names it (as the client spelled it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def unavailable(message: str = "the server is starting up or shutting down; retry shortly") -> APIError:
    return APIError(503, message, code="service_unavailable")
