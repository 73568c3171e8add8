"""The OpenAI-compatible routes: chat and text completions, the model list."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import JSONResponse, Response

from tokenspeed.runtime.entrypoints.openai.errors import APIError
from tokenspeed.runtime.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from tokenspeed.runtime.entrypoints.openai.serving_chat import create_chat_completion
from tokenspeed.runtime.entrypoints.openai.serving_completions import create_completion
from tokenspeed.runtime.entrypoints.routes.deps import Server, new_router, require_ready

router = new_router()


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request, state: Server) -> Response:
    require_ready(state)
    return await create_chat_completion(state, req, request)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request, state: Server) -> Response:
    require_ready(state)
    return await create_completion(state, req, request)


@router.get("/v1/models")
async def models(state: Server) -> Response:
    limits = state.llm.limits
    data = [
        {
            "id": name,
            "object": "model",
            "created": int(state.started_at),
            "owned_by": "tokenspeed",
            "root": str(state.server_args.model),
            "max_model_len": limits.max_model_len if limits else None,
        }
        for name in state.served_model_names
    ]
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, state: Server) -> Response:
    if not state.accepts_model(model_id):
        raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
    return JSONResponse(
        {"id": model_id, "object": "model", "created": int(state.started_at), "owned_by": "tokenspeed"}
    )
