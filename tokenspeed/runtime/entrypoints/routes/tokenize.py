"""POST /tokenize and /detokenize with vLLM's bodies, so clients that count tokens against this server
(context budgeting, prompt caching keys) get the ids the server itself would use.

/tokenize: `{"prompt": str}` (`add_special_tokens`, default true) or `{"messages": [...]}` through the chat
template (`add_generation_prompt`, default true; `tools`, `chat_template_kwargs`), optionally
`return_token_strs`; answers `{"count", "max_model_len", "tokens", "token_strs"}`.
/detokenize: `{"tokens": [ids]}`; answers `{"prompt": text}`. Bad input is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.engine.prompt_encoder import check_unicode
from tokenspeed.runtime.entrypoints.openai.errors import bad_request
from tokenspeed.runtime.entrypoints.openai.serving_common import check_model, translate_errors
from tokenspeed.runtime.entrypoints.routes.deps import Server, json_body, new_router
from tokenspeed.runtime.entrypoints.server_state import ServerState

router = new_router()

_TOKENIZE_FIELDS = frozenset(
    {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "tools",
     "chat_template_kwargs", "return_token_strs"}
)  # fmt: skip


# apply_chat_template arguments the route sets itself (or that would change what it returns)
_SET_HERE = frozenset(
    {"add_generation_prompt", "tools", "messages", "conversation", "tokenize", "chat_template", "return_dict",
     "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs"}
)  # fmt: skip


def _check_tokenizer(state: ServerState) -> None:
    if state.tokenizer is None:
        raise bad_request("this server was started with --skip-tokenizer-init: it has no tokenizer")


async def _body(request: Request, fields: frozenset[str]) -> dict[str, Any]:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise bad_request(f"{unknown[0]}: not a field of this route (it reads {', '.join(sorted(fields))})",
                          param=unknown[0])  # fmt: skip
    return body


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false", param=name)
    return value


@router.post("/tokenize")
async def tokenize(request: Request, state: Server) -> Response:
    _check_tokenizer(state)
    body = await _body(request, _TOKENIZE_FIELDS)
    check_model(state, body.get("model"))
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise bad_request("send exactly one of `prompt` or `messages`", param="prompt")
    try:
        if prompt is not None:
            if not isinstance(prompt, str):
                raise bad_request("prompt must be a string", param="prompt")
            if _flag(body, "add_special_tokens", True):
                ids = await state.llm.prompts.encode(prompt, "prompt")
            else:
                state.llm.prompts.check_length(len(prompt), "prompt")
                check_unicode(prompt, "prompt")
                ids = state.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise bad_request("messages must be a list of message objects", param="messages")
            kwargs = body.get("chat_template_kwargs") or {}
            if not isinstance(kwargs, dict) or set(kwargs) & _SET_HERE:
                raise bad_request(
                    f"chat_template_kwargs must be an object without {sorted(_SET_HERE)}",
                    param="chat_template_kwargs",
                )
            tools = body.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise bad_request("tools must be a list of tool objects", param="tools")
            ids = await state.llm.prompts.encode_chat(
                messages,
                add_generation_prompt=_flag(body, "add_generation_prompt", True),
                tools=tools,
                **kwargs,
            )
    except ValueError as exc:
        raise translate_errors(exc) from exc
    limits = state.llm.limits
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": limits.max_model_len if limits is not None else None,
        "tokens": ids,
        "token_strs": None,
    }
    if _flag(body, "return_token_strs", False):
        out["token_strs"] = state.tokenizer.convert_ids_to_tokens(ids)
    return JSONResponse(out)


@router.post("/detokenize")
async def detokenize(request: Request, state: Server) -> Response:
    _check_tokenizer(state)
    body = await _body(request, frozenset({"model", "tokens"}))
    check_model(state, body.get("model"))
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise bad_request("tokens must be a list of token ids", param="tokens")
    try:
        state.llm.check_token_ids("tokens", tokens)
    except ValueError as exc:
        raise bad_request(str(exc), param="tokens") from exc
    return JSONResponse({"prompt": state.tokenizer.decode(tokens)})
