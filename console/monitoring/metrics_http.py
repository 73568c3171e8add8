"""The supervisor's loopback HTTP port: `GET /metrics` (its Prometheus metrics) and `GET /health`.

It listens on 127.0.0.1 on a port the kernel picks when the supervisor starts; Prometheus finds it through
`prometheus/supervisor.json` in the state directory (see targets.py), so no port has to be configured or
kept free. Auth follows the servers' rule: when the fleet's servers run with `api_key`, every route but
/health wants `Authorization: Bearer <one of those keys>`.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from console.monitoring.targets import host_port
from tokenspeed.config.api_key import bearer_token

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LOOPBACK = "127.0.0.1"


def authorized(request: Request, keys: frozenset[str]) -> bool:
    if not keys:
        return True
    token = bearer_token(request.headers.get("authorization", ""))
    return token is not None and any(hmac.compare_digest(token.encode("latin-1"), key.encode()) for key in keys)


def build_app(render: Callable[[], bytes], keys: frozenset[str]) -> Starlette:
    async def metrics(request: Request) -> Response:
        if not authorized(request, keys):
            return JSONResponse({"error": "missing or wrong API key: send Authorization: Bearer KEY"}, 401)
        return Response(render(), media_type=CONTENT_TYPE)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/metrics", metrics), Route("/health", health)])


def bind_loopback(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(64)
    sock.setblocking(False)
    return sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return host_port(host, port)


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the supervisor decides what SIGTERM means."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve_metrics(render: Callable[[], bytes], keys: frozenset[str], sock: socket.socket) -> None:
    config = uvicorn.Config(build_app(render, keys), log_level="warning", lifespan="off", access_log=False)
    await _QuietServer(config).serve(sockets=[sock])
