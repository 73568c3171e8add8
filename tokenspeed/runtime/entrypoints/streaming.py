"""A server-sent-events response that always cleans up its sequences.

Starlette cancels a streaming body when the client disconnects; but a body that never started (the client
left between the request and the first chunk) would never run its own `finally`. `cleanup` runs in every
case, so the sequences are aborted and their KV pages freed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class DisconnectAwareStream(StreamingResponse):
    def __init__(
        self, body: AsyncIterator[str], cleanup: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._body = body
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                await aclose()
            if self._cleanup is not None:
                await self._cleanup()


def closer(gens: list) -> Callable[[], Awaitable[None]]:
    async def close_all() -> None:
        for g in gens:
            await g.aclose()

    return close_all
