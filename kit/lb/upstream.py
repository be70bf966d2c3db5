"""The router's HTTP/1.1 client to its workers: keep-alive pools on raw asyncio protocols.

aiohttp's client took about half of the router's CPU per request (py-spy under `make
bench-lb`): request and response objects, a timer, trace hooks and a StreamReader with its
waiter for each leg. The workers are SGLang's HTTP servers (uvicorn: HTTP/1.1 keep-alive,
`Content-Length` answers, chunked streams), and this module speaks just that:

- `Upstream` holds one `Origin` per worker base URL; `Origin.send` takes an idle connection
  (or opens one), writes the request in one go and returns the connection, which is the
  response handle: `head()` waits for the status line and headers (`status`,
  `content_type`).
- The body is read whole (`read`), or streamed: `first` waits for the first bytes, then
  `relay(sink)` hands every later piece to `sink` straight from the socket callback (no task
  wake-up per token) until the body ends.
- `release()` puts a connection whose answer was read to the end back in its pool; anything
  else (an error, a cancelled leg, a body not read) closes it, which is how SGLang learns that
  a request was abandoned (it aborts it).

Errors: `UpstreamError` (`unsent` when nothing reached the worker: the connection could not be
made, so a retry elsewhere is safe); a limit that expires is passed in by the caller through
`abort(exc)` and raised from the pending read as that exception.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable

from yarl import URL

# A response head larger than this is refused (SGLang's are a few hundred bytes).
MAX_HEAD = 64 * 1024
_PHASE_HEAD, _PHASE_LENGTH, _PHASE_CHUNKED, _PHASE_EOF, _PHASE_DONE = range(5)


class UpstreamError(Exception):
    """An upstream exchange failed; `unsent` when the request never reached the worker."""

    def __init__(self, message: str, *, unsent: bool = False) -> None:
        super().__init__(message)
        self.unsent = unsent


Sink = Callable[[bytes], None]


class Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, and the response of its current request."""

    __slots__ = (
        "_body",
        "_buf",
        "_chunk_left",
        "_error",
        "_keep_alive",
        "_length_left",
        "_paused",
        "_phase",
        "_sink",
        "_waiter",
        "content_type",
        "idle_since",
        "in_use",
        "origin",
        "status",
        "transport",
    )

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.in_use = False  # handed out to a caller, who must `release` or `close` it
        self._buf = b""
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = ""
        self._phase = _PHASE_HEAD
        self._keep_alive = True
        self._length_left = 0
        self._chunk_left = 0  # chunked: bytes left of the current chunk and its CRLF
        self._body: list[bytes] = []
        self._sink: Sink | None = None
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.origin.lost(self)
        if self._phase == _PHASE_EOF:
            self._phase = _PHASE_DONE
            self._wake()
        elif self._phase != _PHASE_DONE and self._error is None:
            detail = f": {exc}" if exc else ""
            self._fail(UpstreamError(f"the worker closed the connection{detail}"))

    def data_received(self, data: bytes) -> None:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self._phase == _PHASE_HEAD:
            data = self._head(data)
            if self._phase == _PHASE_HEAD:
                return
        if self._phase == _PHASE_CHUNKED:
            self._chunks(data)
        elif self._phase == _PHASE_LENGTH:
            left = self._length_left
            if len(data) >= left:
                self._deliver(data[:left] if len(data) > left else data)
                self._finish()
            else:
                self._length_left = left - len(data)
                self._deliver(data)
        elif self._phase == _PHASE_EOF:
            self._deliver(data)
        # _PHASE_DONE: bytes after the answer (none expected); dropped with the connection
        elif data:
            self._keep_alive = False

    # -- parsing -----------------------------------------------------------------------------

    def _head(self, data: bytes) -> bytes:
        """Parse the status line and headers when complete; returns the bytes after them."""
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > MAX_HEAD:
                    self._fail(UpstreamError("the worker's response head is too large"))
                else:
                    self._buf = data
                return b""
            lines = data[:end].split(b"\r\n")
            line = lines[0]
            try:
                status = int(line[9:12])
            except ValueError:
                self._fail(UpstreamError(f"the worker sent a bad status line {line[:80]!r}"))
                return b""
            data = data[end + 4 :]
            if status >= 200 or status < 100:
                break  # 1xx (e.g. 100 Continue): skip it and read the real answer
        keep_alive = line.startswith(b"HTTP/1.1")
        length = -1
        chunked = False
        for raw in lines[1:]:
            name, _, value = raw.partition(b":")
            key = name.lower()
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._fail(UpstreamError("the worker sent a bad Content-Length"))
                    return b""
            elif key == b"content-type":
                self.content_type = value.strip().decode("latin-1")
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif key == b"connection":
                token = value.strip().lower()
                keep_alive = token == b"keep-alive" or (keep_alive and token != b"close")
        self.status = status
        self._keep_alive = keep_alive
        if chunked:
            self._phase = _PHASE_CHUNKED
        elif length >= 0 or status in (204, 304):
            self._length_left = max(length, 0)
            self._phase = _PHASE_LENGTH
            if self._length_left == 0:
                self._finish()
        else:
            self._phase = _PHASE_EOF
            self._keep_alive = False
        self._wake()
        return data

    def _chunks(self, data: bytes) -> None:
        """Deliver the payload in `data` of a chunked body; finish at its last chunk."""
        pos = 0
        size = len(data)
        parts: list[bytes] = []
        while pos < size:
            left = self._chunk_left  # bytes left of the current chunk: payload, then CRLF
            if left > 0:
                take = min(left, size - pos)
                payload = min(take, max(left - 2, 0))
                if payload:
                    parts.append(data[pos : pos + payload])
                pos += take
                self._chunk_left = left - take
                continue
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self._buf = data[pos:]
                break
            try:
                length = int(data[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self._fail(UpstreamError("the worker sent a bad chunk size"))
                return
            if length == 0:  # the last chunk, then (no trailers are expected) a blank line
                rest = data[eol + 2 :]
                if rest.startswith(b"\r\n") or b"\r\n\r\n" in rest:
                    if parts:
                        self._deliver(b"".join(parts))
                    self._finish()
                    return
                self._buf = data[pos:]
                break
            self._chunk_left = length + 2
            pos = eol + 2
        if parts:
            self._deliver(parts[0] if len(parts) == 1 else b"".join(parts))

    # -- delivery ----------------------------------------------------------------------------

    def _deliver(self, data: bytes) -> None:
        if not data:
            return
        sink = self._sink
        if sink is not None:
            try:
                sink(data)
            except Exception as exc:  # a bug in the sink: end this exchange, not the loop
                self._fail(exc)
            return
        self._body.append(data)
        self._wake()

    def _finish(self) -> None:
        self._phase = _PHASE_DONE
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._keep_alive = False
        if self.transport is not None:
            self.transport.close()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_exception(error)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    # -- the response, for the caller ----------------------------------------------------------

    async def head(self) -> None:
        """Wait for the status line and headers (`status`, `content_type`)."""
        while self._phase == _PHASE_HEAD:
            await self._wait()
        if self._error is not None:
            raise self._error

    async def read(self) -> bytes:
        """The whole body."""
        while self._phase != _PHASE_DONE:
            await self._wait()
        if self._error is not None:
            raise self._error
        body = self._body
        self._body = []
        return body[0] if len(body) == 1 else b"".join(body)

    async def first(self) -> bytes:
        """The body bytes that arrived first (b"" when the body is empty)."""
        while not self._body and self._phase != _PHASE_DONE:
            await self._wait()
        if self._error is not None:
            raise self._error
        body = self._body
        self._body = []
        return b"".join(body)

    async def relay(self, sink: Sink) -> bool:
        """Hand the body's next bytes to `sink` as they arrive (from the socket callback).

        Returns True at the body's end, False when `pause_reading` was called (by the sink,
        whose client does not keep up): call `resume_reading`, then `relay` again.
        """
        if self._body:
            pending, self._body = self._body, []
            for data in pending:
                sink(data)
        self._sink = sink
        try:
            while self._phase != _PHASE_DONE and not self._paused:
                await self._wait()
        finally:
            self._sink = None
        if self._error is not None:
            raise self._error
        return self._phase == _PHASE_DONE

    @property
    def done(self) -> bool:
        """Whether the whole answer was received."""
        return self._phase == _PHASE_DONE and self._error is None

    @property
    def reusable(self) -> bool:
        """Whether the connection may carry another request (nothing came after the answer)."""
        return self._keep_alive and self._error is None

    def pause_reading(self) -> None:
        """Stop reading from the worker until `resume_reading` (`relay` returns False)."""
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def resume_reading(self) -> None:
        self._paused = False
        if self.transport is not None:
            self.transport.resume_reading()

    def abort(self, error: BaseException) -> None:
        """Give up on this answer: the pending read raises `error`; the connection closes."""
        if self._phase != _PHASE_DONE or self._error is not None:
            self._fail(error)

    def release(self) -> None:
        """Back to the pool when the answer was read to its end; closed otherwise."""
        transport = self.transport
        if (
            self._phase == _PHASE_DONE
            and self._error is None
            and self._keep_alive
            and transport is not None
            and not transport.is_closing()
        ):
            self.origin.put_back(self)
            return
        self.close()

    def close(self) -> None:
        """Drop the connection (a worker aborts the request it was answering)."""
        self._keep_alive = False
        if self._error is None and self._phase != _PHASE_DONE:
            self._error = UpstreamError("the response was abandoned")
        if self.transport is not None:
            self.transport.close()
        self.origin.done_with(self)

    def begin(self) -> None:
        """A new request on this connection."""
        self._reset()


class Origin:
    """One worker base URL: its idle connections and how to open a new one."""

    def __init__(self, upstream: Upstream, base_url: str) -> None:
        url = URL(base_url)
        self._upstream = upstream
        self.host = url.raw_host or ""
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = url.scheme == "https"
        self.path_prefix = url.raw_path.rstrip("/").encode()
        authority = url.raw_authority or self.host
        self._host_line = b"Host: " + authority.encode("ascii") + b"\r\n"
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._heads: dict[tuple[bytes, bytes], bytes] = {}

    def request_head(self, method: bytes, path: bytes) -> bytes:
        """The request line and Host header for `path` on this worker (built once per path)."""
        line = self._heads.get((method, path))
        if line is None:
            line = b"%s %s%s HTTP/1.1\r\n%s" % (method, self.path_prefix, path, self._host_line)
            self._heads[(method, path)] = line
        return line

    def send_now(self, head: bytes, body: bytes) -> Connection | None:
        """Send one request on an idle connection, at once; None when there is none (then
        `send`)."""
        conn = self._idle_connection()
        if conn is None:
            return None
        self._upstream.acquired += 1
        conn.in_use = True
        return self._write(conn, head, body)

    async def send(self, head: bytes, body: bytes) -> Connection:
        """Send one request (`head` ends with the blank line); the connection then waits for
        its answer (`head()`, `read()`...). UpstreamError(unsent) when it cannot connect."""
        return self._write(await self._connection(), head, body)

    @staticmethod
    def _write(conn: Connection, head: bytes, body: bytes) -> Connection:
        conn.begin()
        transport = conn.transport
        if transport is None or transport.is_closing():  # lost between the pool and here
            conn.close()
            raise UpstreamError("the worker closed the connection")
        if len(body) < 16384:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        return conn

    async def _connection(self) -> Connection:
        """An idle connection, or a new one once `max_connections` allows it."""
        upstream = self._upstream
        while True:
            conn = self._idle_connection()
            if conn is None and not upstream.has_slot():
                await upstream.wait_slot()
                continue
            upstream.acquired += 1
            if conn is None:
                try:
                    conn = await self._connect()
                except BaseException:
                    upstream.free_slot()
                    raise
            conn.in_use = True
            return conn

    def _idle_connection(self) -> Connection | None:
        """The most recently used idle connection still open and fresh, if any."""
        idle = self._idle
        now = self._upstream.loop.time()
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if transport is None or transport.is_closing():
                continue
            if not conn.reusable or now - conn.idle_since > self._upstream.keepalive:
                transport.close()
                continue
            return conn
        return None

    async def _connect(self) -> Connection:
        upstream = self._upstream
        try:
            async with asyncio.timeout(upstream.connect_timeout):
                _, conn = await upstream.loop.create_connection(
                    lambda: Connection(self),
                    self.host,
                    self.port,
                    ssl=upstream.tls_context() if self.tls else None,
                )
        except TimeoutError:
            raise UpstreamError(
                f"no connection within {upstream.connect_timeout:g} s (--connect-timeout)",
                unsent=True,
            ) from None
        except OSError as exc:
            raise UpstreamError(exc.strerror or str(exc), unsent=True) from exc
        self._open.add(conn)
        return conn

    def put_back(self, conn: Connection) -> None:
        """A connection whose answer was read whole: idle, ready for the next request."""
        conn.idle_since = self._upstream.loop.time()
        self._idle.append(conn)
        self.done_with(conn)

    def done_with(self, conn: Connection) -> None:
        """The caller gave `conn` back (idle or closed): its slot is free again."""
        if conn.in_use:
            conn.in_use = False
            self._upstream.free_slot()

    def lost(self, conn: Connection) -> None:
        """A connection closed (idle or in use: its user still gives it back)."""
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._open):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()


class Upstream:
    """Connection pools to every worker; `max_connections` caps connections in use (0: none)."""

    def __init__(
        self, *, connect_timeout: float, keepalive: float, max_connections: int = 0
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.max_connections = max_connections
        self.acquired = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None

    def origin(self, base_url: str) -> Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = Origin(self, base_url)
        return origin

    def tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def has_slot(self) -> bool:
        """Whether one more connection may be in use."""
        return not self.max_connections or self.acquired < self.max_connections

    async def wait_slot(self) -> None:
        """Wait until a connection in use is given back."""
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken and cancelled at once: pass the turn on
            raise

    def free_slot(self) -> None:
        self.acquired -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def forget(self, base_url: str) -> None:
        """A worker was removed: close its connections."""
        origin = self._origins.pop(base_url, None)
        if origin is not None:
            origin.close()

    async def close(self) -> None:
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()
        await asyncio.sleep(0)  # let the transports finish closing
