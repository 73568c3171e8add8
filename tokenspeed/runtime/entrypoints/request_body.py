"""What a request body must be before any handler sees it: at most `--max-request-bytes`, JSON whose text
is valid Unicode, and a shape the server can serve (`request_shape`: prompt and message counts, nesting).

The size is checked as the body arrives: a declared `Content-Length` over the limit is answered 413 at
once, without reading the body; a body without one is cut off once it passes the limit. A body that
parses (off the event loop when large: `body_parser`) is checked for lone surrogates (`"\\ud800"` is valid
JSON but not text any tokenizer or response can carry), so the client is told which field is wrong instead
of getting a 500 later.
"""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenspeed.runtime.entrypoints.openai.errors import APIError
from tokenspeed.runtime.entrypoints.request_shape import ShapeError

# A body declared this much over the limit is not read at all (the connection is closed after the 413);
# a smaller one is read and dropped, so that a client still sending it gets to read the 413.
_DRAIN_FACTOR = 8


class BodyRefused(HTTPException):
    """Raised while reading a body; FastAPI lets it through its own body parsing to the app's handler."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(status_code=status, detail=message)
        self.code = code
        self.param = param

    def api_error(self) -> APIError:
        return APIError(self.status_code, str(self.detail), param=self.param, code=self.code)


def too_large(max_bytes: int, size: int | None = None) -> BodyRefused:
    got = f" ({size} bytes)" if size is not None else ""
    return BodyRefused(
        413,
        f"the request body is larger than this server accepts{got}: at most {max_bytes} bytes "
        "(--max-request-bytes); send a shorter prompt",
        code="request_too_large",
    )


class BodyLimitMiddleware:
    """Plain ASGI, so streaming responses and disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= self.max_bytes * _DRAIN_FACTOR:
                await _drain(receive)
            return await too_large(self.max_bytes, declared).api_error().response()(scope, receive, send)
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(self.max_bytes)
            return message

        await self.app(scope, limited, send)


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or []:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class CheckedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            state = self.scope["app"].state.server
            try:
                self._json = await state.bodies.parse(self.scope["path"], body, state.shape_limits())
            except ShapeError as exc:
                raise BodyRefused(exc.status, str(exc), code=exc.code, param=exc.param) from None
        return self._json


class CheckedRoute(APIRoute):
    """Routes whose handlers (and FastAPI's own body parsing) read JSON through `body_parser`: syntax,
    shape (`request_shape`) and valid text checked before any handler sees it."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def checked(request: Request):
            return await handler(CheckedRequest(request.scope, request.receive))

        return checked
