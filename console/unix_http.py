"""HTTP/1.1 over a unix socket, kept alive between requests: what the supervisor client speaks.

The console asks its supervisor two or three questions a second, forever. Through httpx each one costs
about 0.60 ms of CPU (its client, transport and connection-pool layers); through the standard library's
http.client, on a connection kept open, 0.20 ms (benchmarks/unix_http_cost.py, against a real
supervisor: benchmarks/results/unix_http_cost.json). Errors stay the standard library's: OSError (nothing
answers, a timeout, a connection cut) and http.client.HTTPException (an answer that is not HTTP).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from typing import Any
from urllib.parse import urlencode


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("supervisor", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def closed_by_peer(self) -> bool:
        """An idle connection the other end has closed (its keep-alive ran out) reads as readable: EOF."""
        if self.sock is None:
            return True
        poller = select.poll()  # not select.select: it cannot watch a descriptor above 1023
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))


class Answer:
    """An HTTP answer, read whole."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class UnixHTTP:
    """Requests to the HTTP server on a unix socket; safe to share between threads (each request takes an
    idle connection of its own, or opens one)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._idle: list[UnixConnection] = []
        self._lock = threading.Lock()

    def request(
        self, method: str, url: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Answer:
        if params:
            url += "?" + urlencode(params)
        timeout = self.timeout if timeout is None else timeout
        conn = self._take()
        if conn is not None:
            try:
                return self._send(conn, method, url, timeout)
            except (ConnectionError, http.client.RemoteDisconnected):
                # Closed between the check and the request: a GET is asked again, on a new connection;
                # anything else might have been done already, so the error stands.
                if method != "GET":
                    raise
        return self._send(UnixConnection(self.path, timeout), method, url, timeout)

    def _take(self) -> UnixConnection | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed_by_peer():
                    return conn
                conn.close()
        return None

    def _send(self, conn: UnixConnection, method: str, url: str, timeout: float) -> Answer:
        try:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request(method, url)
            response = conn.getresponse()
            answer = Answer(response.status, response.read())
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.append(conn)
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
