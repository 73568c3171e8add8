"""The native API's route: POST /generate (SGLang's shape; `native_api` runs it)."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from tokenspeed.runtime.entrypoints.native_api import GENERATE_OPENAPI
from tokenspeed.runtime.entrypoints.native_api import generate as native_generate
from tokenspeed.runtime.entrypoints.routes.deps import Server, json_body, new_router, require_ready

router = new_router()


@router.post("/generate", openapi_extra=GENERATE_OPENAPI)
async def generate(request: Request, state: Server) -> Response:
    require_ready(state)
    return await native_generate(state, await json_body(request), request)
