"""Relaying a decode worker's SSE stream to the client.

Without logprobs to merge, bytes pass through unchanged; only the cut points are chosen at event
boundaries (a blank line), so that an error event appended after a failure never lands inside a
half-written event. With logprobs to merge, each `data:` event is rewritten by a
`StreamMerger`. Time to first token and inter-token gaps are measured here, at the moment bytes
are handed to the client.

The first bytes go out through aiohttp's response (which sends the head with them); every later
piece is written by `on_data`, called by the upstream connection as the bytes arrive (see
`kit.lb.upstream`), as one HTTP chunk straight to the client's transport: no task wakes up per
token. A client that reads slower than the worker writes pauses the upstream reads until its
buffer drains.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from kit.lb.errors import ApiError
from kit.lb.metrics import Histogram
from kit.lb.upstream import Connection
from kit.lb.watchdog import Guard
from kit.lb.workers import Worker

DONE_EVENT = b"data: [DONE]\n\n"
# A stream that never shows an event boundary is flushed anyway past this many bytes.
MAX_PENDING = 1024 * 1024


class EventRewriter(Protocol):
    """Rewrites one `data:` payload (logprobs merged, or a migrated stream rejoined)."""

    def event(self, payload: bytes) -> bytes: ...


class ClientGone(Exception):
    """The client closed its connection while the stream was being written."""


class StreamRelay:
    """Copies one upstream stream to one client response, measuring token timing.

    `events` counts the data events relayed (`[DONE]` excluded); `first_at` and `last_at` are
    when the first and the last went out (monotonic s, None before)."""

    def __init__(
        self,
        out: web.StreamResponse,
        request: web.BaseRequest,
        *,
        started: float,
        ttft: Histogram,
        itl: Histogram,
        guard: Guard,
        worker: Worker,
        merger: EventRewriter | None = None,
    ) -> None:
        self._out = out
        self._request = request
        self._started = started
        self._ttft = ttft
        self._itl = itl
        self._guard = guard
        self._worker = worker
        self._merger = merger
        self._pending = b""
        self._upstream: Connection | None = None
        self._transport: asyncio.Transport | None = None
        self._protocol: RequestHandler | None = None
        self.first_at: float | None = None
        self._last_event_at: float | None = None  # None until the first event went out
        self._done_sent = False
        self.events = 0
        self.last_data: bytes | None = None  # the last events the client got (migration)

    def rebind(self, guard: Guard, worker: Worker, merger: EventRewriter | None) -> None:
        """Continue the same client stream from another decode (a migration): its events go
        through `merger`; token timing carries on (no second TTFT)."""
        self._guard = guard
        self._worker = worker
        self._merger = merger
        self._pending = b""
        self._upstream = None

    async def run(self, upstream: Connection, first: bytes) -> None:
        """Forward `first` and the rest of `upstream` until its end.

        Upstream errors propagate (UpstreamError, or the exception the stream was aborted with:
        TimeoutError when the watchdog expired the guard): the caller decides which error event
        ends the stream. A client that went away raises ClientGone.
        """
        self._guard.touch()
        await self._first(first)
        self._upstream = upstream
        transport = self._transport = self._request.transport
        protocol = self._protocol = self._request.protocol
        while not await upstream.relay(self.on_data):
            # The client's buffer is full: wait until it drains, then read on.
            if transport is None or transport.is_closing():
                raise ClientGone("the client went away")
            if protocol.writing_paused:
                await self._request.writer.drain()
            upstream.resume_reading()
        self.flush()

    async def _first(self, chunk: bytes) -> None:
        """The first bytes, through aiohttp, which sends the response head with them (an
        empty write sends the head alone)."""
        data = self._complete(chunk) if chunk else None
        try:
            await self._out.write(self._prepare(data) if data else b"")
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    def on_data(self, chunk: bytes) -> None:
        """The upstream's next bytes: forward its complete events now."""
        guard = self._guard
        guard.last = now = time.monotonic()
        self._worker.progress_at = now
        if self._pending or self._merger is not None or not chunk.endswith(b"\n\n"):
            data = self._complete(chunk)
            if data is None:
                return
        else:
            data = chunk
        self._write(self._prepare(data, now))

    def _complete(self, chunk: bytes) -> bytes | None:
        """The complete events of `pending + chunk` (None if there are none yet); keeps the
        incomplete tail."""
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            if len(data) <= MAX_PENDING:
                self._pending = data
                return None
            self._pending = b""
            return data
        cut += 2
        if cut == len(data):
            self._pending = b""
            return data
        self._pending = data[cut:]
        return data[:cut]

    def _prepare(self, data: bytes, now: float | None = None) -> bytes:
        """Merge logprobs in (if asked) and time the events of `data`."""
        if self._merger is not None:
            data = merge_events(self._merger, data)
        events = data.count(b"data:")
        if events:
            self._account(data, events, now)
            self.last_data = data
        return data

    def _write(self, data: bytes) -> None:
        transport = self._transport  # the client's, kept from `run` (a property lookup less)
        if transport is None or transport.is_closing():
            if self._upstream is not None:
                self._upstream.abort(ClientGone("the client went away"))
            return
        transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        protocol, upstream = self._protocol, self._upstream
        if protocol is not None and protocol.writing_paused and upstream is not None:
            upstream.pause_reading()

    def flush(self) -> None:
        """Forward whatever is left (a stream that did not end with a blank line)."""
        if self._pending:
            data, self._pending = self._pending, b""
            self._write(self._prepare(data))

    async def finish(self) -> None:
        """End the stream with `[DONE]` (a migrated stream whose last token had been sent)."""
        self._pending = b""
        if self._done_sent:
            return
        self._done_sent = True
        try:
            await self._out.write(DONE_EVENT)
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    async def fail(self, error: ApiError) -> None:
        """End the stream with an error event and `[DONE]` (drops an incomplete tail)."""
        self._pending = b""
        if self._done_sent:
            return
        self._done_sent = True
        try:
            await self._out.write(error.event() + DONE_EVENT)
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    def _account(self, data: bytes, events: int, now: float | None) -> None:
        """Time the `events` data events of `data` (`[DONE]` is not a token)."""
        if b"[DONE]" in data:
            events -= 1
            self._done_sent = True
        if events > 0:
            self._time(events, now if now is not None else time.monotonic())

    @property
    def last_at(self) -> float | None:
        return self._last_event_at

    def _time(self, events: int, now: float) -> None:
        """The first event ever is the TTFT; each later write is one gap, and the other events
        of the same write count as gaps of zero."""
        self.events += events
        if self._last_event_at is None:
            self.first_at = now
            self._ttft.observe(now - self._started)
        else:
            self._itl.observe(now - self._last_event_at)
        for _ in range(events - 1):
            self._itl.observe(0.0)
        self._last_event_at = now


def merge_events(merger: EventRewriter, data: bytes) -> bytes:
    """Rewrite every `data:` line of complete SSE events with `merger`."""
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                event = merger.event(payload)
                # b":" drops the event: an SSE comment, which clients skip
                lines[i] = event if event == b":" else b"data: " + event
    return b"\n".join(lines)
