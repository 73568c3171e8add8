"""What every router's handlers share: the server's state, the ready gate, a JSON body read by hand."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from tokenspeed.runtime.entrypoints.openai.errors import bad_request, unavailable
from tokenspeed.runtime.entrypoints.request_body import CheckedRoute
from tokenspeed.runtime.entrypoints.server_state import ServerState


def server_state(request: Request) -> ServerState:
    return request.app.state.server


# A handler parameter `state: Server` is the app's ServerState (no closure over it, no request field).
Server = Annotated[ServerState, Depends(server_state)]


def new_router() -> APIRouter:
    # Every route reads its JSON through request_body's checks (body size, valid text).
    return APIRouter(route_class=CheckedRoute)


def require_ready(state: ServerState) -> None:
    if not state.ready:
        raise unavailable(f"the server is {state.status}; retry shortly")


async def json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from exc
