"""A minimal HTTP/1.1 server on raw asyncio protocols, for the fake worker.

Fast enough that a fake worker is never the bottleneck of a benchmark (aiohttp's server costs
several times more CPU per request), and just the HTTP that SGLang's clients use: keep-alive,
`Content-Length` or chunked request bodies, `Expect: 100-continue`, `Content-Length` or chunked
(streamed) responses, `Connection: close`.

A handler gets each request with a `Reply` to answer on. It answers at once and returns None,
or returns a coroutine that the connection runs as a task; that task is cancelled if the client
goes away first. Requests on one connection are handled one at a time, in order.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

MAX_HEAD = 64 * 1024  # bytes of request line + headers before the server answers 431

_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


@dataclass(slots=True)
class Request:
    """One parsed request; header names are lower-cased."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Request, "Reply"], Coroutine[Any, Any, None] | None]


class Reply:
    """The answer to one request: a whole body (`send`, `json`) or a chunked stream."""

    __slots__ = ("_conn", "done", "keep_alive", "streaming")

    def __init__(self, conn: Connection, keep_alive: bool) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        self.done = False
        self.streaming = False

    @property
    def _connection_header(self) -> bytes:
        return b"" if self.keep_alive else b"Connection: close\r\n"

    def send(self, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
        self._last_write(
            b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s"
            % (
                _STATUS_LINES.get(status) or b"HTTP/1.1 %d X\r\n" % status,
                content_type,
                len(body),
                self._connection_header,
                body,
            )
        )

    def json(self, status: int, payload: Any) -> None:
        self.send(status, json.dumps(payload).encode())

    def text(self, status: int, text: str) -> None:
        self.send(status, text.encode(), b"text/plain; charset=utf-8")

    def start_stream(self, content_type: bytes = b"text/event-stream") -> None:
        """Send a 200 head; the body follows as chunks (`write`), ended by `end_stream`."""
        transport = self._conn.transport
        self.streaming = True
        if transport is None or transport.is_closing():
            return
        transport.write(
            b"%sContent-Type: %s\r\nTransfer-Encoding: chunked\r\n%s\r\n"
            % (_STATUS_LINES[200], content_type, self._connection_header)
        )

    def write(self, *chunks: bytes) -> None:
        """Chunks of a started stream, in one write (empty ones are skipped: they would end it)."""
        transport = self._conn.transport
        if transport is not None and not transport.is_closing():
            transport.write(_chunked(chunks))

    def end_stream(self, *chunks: bytes) -> None:
        """The last chunks of a started stream and its end, in one write."""
        self._last_write(_chunked(chunks) + b"0\r\n\r\n")

    def _last_write(self, data: bytes) -> None:
        """The end of the answer (once); closes the connection unless it is kept alive."""
        if self.done:
            return
        self.done = True
        transport = self._conn.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        if not self.keep_alive:
            transport.close()

    def abort(self) -> None:
        """Drop the connection now (a worker dying mid-answer)."""
        self.done = True
        self.keep_alive = False
        if self._conn.transport is not None:
            self._conn.transport.abort()


def _chunked(chunks: tuple[bytes, ...]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c)


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """A complete chunked body from `buf[start:]`: (body, end offset), or None if incomplete."""
    parts: list[bytes] = []
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)  # no trailers expected; skip any
            return (b"".join(parts), end + 4) if end >= 0 else None
        if len(buf) < pos + size + 2:
            return None
        parts.append(bytes(buf[pos : pos + size]))
        pos += size + 2


class Connection(asyncio.Protocol):
    """One client connection: parse requests, hand each to the handler, one at a time."""

    def __init__(self, handler: Handler, live: set[Connection]) -> None:
        self.handler = handler
        self.live = live
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.continued = False  # sent "100 Continue" for the request being received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.live.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.live.discard(self)
        if self.task is not None:
            self.task.cancel()

    def _serve(self) -> None:
        while self.task is None and self.transport and not self.transport.is_closing():
            parsed = self._parse()
            if parsed is None:
                return
            request, reply = parsed
            try:
                pending = self.handler(request, reply)
            except Exception:  # a bug in the fake: say so, keep serving
                traceback.print_exc(file=sys.stderr)
                pending = None
            if pending is not None:
                self.task = asyncio.get_running_loop().create_task(self._finish(pending, reply))
                return
            self._answered(reply)

    async def _finish(self, pending: Coroutine[Any, Any, None], reply: Reply) -> None:
        try:
            await pending
        except Exception:
            traceback.print_exc(file=sys.stderr)
        self.task = None
        self._answered(reply)
        if self.buf:
            self._serve()

    def _answered(self, reply: Reply) -> None:
        if not reply.done:
            if reply.streaming:
                reply.end_stream()
            else:
                reply.json(500, {"error": {"message": "the fake worker did not answer"}})

    def _fail(self, status: int, message: str) -> None:
        reply = Reply(self, keep_alive=False)
        reply.json(status, {"error": {"message": message}})
        self.buf.clear()

    def _parse(self) -> tuple[Request, Reply] | None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._fail(431, "request head too large")
            return None
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            self._fail(400, f"bad request line {lines[0]!r}")
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        try:
            if "chunked" in headers.get("transfer-encoding", ""):
                whole = _dechunk(buf, start)
            else:
                stop = start + int(headers.get("content-length", "0"))
                whole = (bytes(buf[start:stop]), stop) if len(buf) >= stop else None
        except ValueError:
            self._fail(400, "bad Content-Length or chunk size")
            return None
        if whole is None:
            if not self.continued and headers.get("expect", "").lower() == "100-continue":
                self.continued = True
                if self.transport is not None:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return None
        body, stop = whole
        del buf[:stop]
        self.continued = False
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        path, _, query = target.partition("?")
        return Request(method, path, query, headers, body), Reply(self, keep_alive)


class HttpServer:
    """Listens on one port and answers every request with `handler`."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._live: set[Connection] = set()
        self._server: asyncio.Server | None = None

    async def listen(self, host: str, port: int) -> int:
        """Start listening on host:port (0: any free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self.handler, self._live),
            host,
            port,
            backlog=4096,
            reuse_address=True,
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    def kill(self) -> None:
        """Stop listening and drop every connection now, as a killed process would; `close`
        then waits for the server to be closed."""
        self._shut(abort=True)

    def _shut(self, *, abort: bool) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._live):
            if conn.transport is not None:
                if abort:
                    conn.transport.abort()
                else:
                    conn.transport.close()

    async def close(self) -> None:
        """Stop listening and close every connection (requests in flight are cancelled)."""
        if self._server is None:
            return
        self._shut(abort=False)
        await self._server.wait_closed()
        self._server = None
