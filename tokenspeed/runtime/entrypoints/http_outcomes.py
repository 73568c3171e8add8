"""Every HTTP answer counted by status code, and every 503 told when to come back.

`tokenspeed:http_responses_total{status}` counts the answers to clients (the monitoring routes /health,
/metrics and /get_server_info are left out: a supervisor polling a starting server would otherwise count as
errors). A 503 (starting, draining, overloaded) carries `Retry-After`, so clients and load balancers back
off and retry elsewhere instead of hammering a server that is going away. Plain ASGI, like the API-key
middleware, so streams and disconnects pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Seconds a client should wait before retrying a 503: about one supervisor health interval.
RETRY_AFTER_S = 2
_UNCOUNTED = ("/health", "/metrics", "/get_server_info")


class ResponseOutcomes:
    def __init__(self, app: ASGIApp, count: Callable[[int], None]) -> None:
        self.app = app
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        counted = scope["path"] not in _UNCOUNTED
        started = False

        async def send_outcome(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                if status == 503:
                    headers = list(message.get("headers") or [])
                    if not any(k.lower() == b"retry-after" for k, _ in headers):
                        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
                        message = {**message, "headers": headers}
                if counted:
                    self.count(status)
            await send(message)

        try:
            await self.app(scope, receive, send_outcome)
        except Exception:
            if counted and not started:
                self.count(500)  # what the client gets from the server's last-resort handler
            raise
