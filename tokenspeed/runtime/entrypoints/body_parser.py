"""Parsing request bodies without stalling the streams the event loop is serving.

`json.loads` of a 10 MB body holds the interpreter for half a second or more, on a worker thread as much
as on the loop (the parser never lets go of the GIL). So a body over `INLINE_BYTES` is parsed and
shape-checked (`request_shape`) in a separate process, one body at a time; only what passes comes back,
as msgpack, whose decoding costs a fraction of the JSON parse. A refused body costs the loop nothing but
the bytes it hands over. Smaller bodies are parsed on the loop: a process round trip would cost more.

The process is started with the first large body and ends when the server does (its stdin closes).
Protocol on its stdin/stdout: frames of a 4-byte big-endian length and a msgpack payload; a request is
`[path, limits, body]`, an answer `[True, value]` or `[False, error]` (`ShapeError.to_dict`).
"""

from __future__ import annotations

import asyncio
import struct
import sys
from typing import Any

import msgpack

from tokenspeed.runtime.entrypoints.request_shape import ShapeError, ShapeLimits, parse_and_check

# Parsing this much inline costs the loop about 10 ms on a slow core.
INLINE_BYTES = 128 * 1024
_HEADER = struct.Struct(">I")


class BodyParser:
    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def parse(self, path: str, body: bytes, limits: ShapeLimits) -> Any:
        """The body's JSON value; ShapeError for a body refused on its syntax or shape."""
        if len(body) <= INLINE_BYTES:
            return parse_and_check(path, body, limits)
        async with self._lock:
            ok, value = await self._round_trip([path, limits.to_dict(), body])
        if not ok:
            raise ShapeError(value["message"], param=value["param"], code=value["code"], status=value["status"])
        return value

    async def _round_trip(self, request: list) -> tuple[bool, Any]:
        for attempt in range(2):
            proc = await self._process()
            try:
                _write(proc.stdin, msgpack.packb(request, use_bin_type=True))
                await proc.stdin.drain()
                size = _HEADER.unpack(await proc.stdout.readexactly(_HEADER.size))[0]
                payload = await proc.stdout.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
                # The process died (out of memory on a huge body, killed): start another once.
                self._proc = None
                if attempt:
                    raise ShapeError("the server could not read this body; retry shortly", param=None,
                                     code="body_parser_failed", status=503) from None  # fmt: skip
                continue
            # strict_map_key off: a JSON object may have keys msgpack would otherwise refuse to rebuild
            return tuple(msgpack.unpackb(payload, raw=False, strict_map_key=False))  # type: ignore[return-value]
        raise AssertionError("unreachable")

    async def start(self) -> None:
        await self._process()

    async def _process(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
        return self._proc

    def close(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.stdin.close()


def _write(stream: Any, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)


def _serve(stdin: Any, stdout: Any) -> None:
    """The parsing process: answer each framed body until stdin closes."""
    while True:
        head = stdin.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return
        path, limits, body = msgpack.unpackb(stdin.read(_HEADER.unpack(head)[0]), raw=False)
        try:
            answer = [True, parse_and_check(path, body, ShapeLimits(**limits))]
            payload = msgpack.packb(answer, use_bin_type=True)
        except ShapeError as exc:
            payload = msgpack.packb([False, exc.to_dict()], use_bin_type=True)
        except (ValueError, TypeError, OverflowError) as exc:
            # a value msgpack cannot carry (an integer past 64 bits): the route's checks say what is wrong,
            # so the main process parses this body itself
            payload = msgpack.packb([False, {"message": f"the body holds a value this server cannot take: "
                                     f"{exc}", "param": None, "code": "invalid_request", "status": 400}])  # fmt: skip
        stdout.write(_HEADER.pack(len(payload)))
        stdout.write(payload)
        stdout.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
