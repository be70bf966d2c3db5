"""Relaying a decode worker's SSE stream to the client.

Without logprobs to merge, bytes pass through unchanged; only the cut points are chosen at event
boundaries (a blank line), so that an error event appended after a failure never lands inside a
half-written event. With logprobs to merge, each `data:` event is rewritten by a
`StreamMerger`. Time to first token and inter-token gaps are measured here, at the moment bytes
are handed to the client.
"""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from kit.lb.errors import ApiError
from kit.lb.logprobs import StreamMerger
from kit.lb.metrics import Histogram
from kit.lb.watchdog import Guard

DONE_EVENT = b"data: [DONE]\n\n"
# A stream that never shows an event boundary is flushed anyway past this many bytes.
MAX_PENDING = 1024 * 1024


class ClientGone(Exception):
    """The client closed its connection while the stream was being written."""


class StreamRelay:
    """Copies one upstream stream to one client response, measuring token timing."""

    def __init__(
        self,
        out: web.StreamResponse,
        started: float,
        ttft: Histogram,
        itl: Histogram,
        merger: StreamMerger | None = None,
    ) -> None:
        self._out = out
        self._started = started
        self._ttft = ttft
        self._itl = itl
        self._merger = merger
        self._pending = b""
        self._last_event_at: float | None = None  # None until the first event went out
        self._done_sent = False

    async def run(self, upstream: aiohttp.ClientResponse, first: bytes, guard: Guard) -> None:
        """Forward `first` and the rest of `upstream` until EOF.

        Upstream read errors propagate (aiohttp.ClientError; the watchdog expiring `guard`
        closes the upstream, which shows up the same way): the caller decides which error event
        ends the stream. A client that went away raises ClientGone.
        """
        chunk = first
        read = upstream.content.readany
        write = self._out.write
        touch = guard.touch
        while chunk:
            touch()
            if self._pending or self._merger is not None or not chunk.endswith(b"\n\n"):
                await self.feed(chunk)
            else:  # the common case, whole events: no copy, no extra await layer
                events = chunk.count(b"data:")
                if events:
                    self._account(chunk, events)
                try:
                    await write(chunk)
                except ConnectionError as exc:
                    raise ClientGone(str(exc)) from exc
            chunk = await read()
        await self.flush()

    async def feed(self, chunk: bytes) -> None:
        """Forward the complete events in `pending + chunk`; keep the incomplete tail."""
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            if len(data) <= MAX_PENDING:
                self._pending = data
                return
            self._pending = b""
            await self._write(data)
            return
        cut += 2
        if cut == len(data):
            self._pending = b""
            await self._write(data)
        else:
            self._pending = data[cut:]
            await self._write(data[:cut])

    async def flush(self) -> None:
        """Forward whatever is left (a stream that did not end with a blank line)."""
        if self._pending:
            data, self._pending = self._pending, b""
            await self._write(data)

    async def fail(self, error: ApiError) -> None:
        """End the stream with an error event and `[DONE]` (drops an incomplete tail)."""
        self._pending = b""
        if self._done_sent:
            return
        self._done_sent = True
        await self._send(error.event() + DONE_EVENT)

    async def _write(self, data: bytes) -> None:
        if self._merger is not None:
            data = merge_events(self._merger, data)
        events = data.count(b"data:")
        if events:
            self._account(data, events)
        await self._send(data)

    async def _send(self, data: bytes) -> None:
        try:
            await self._out.write(data)
        except ConnectionError as exc:
            raise ClientGone(str(exc)) from exc

    def _account(self, data: bytes, events: int) -> None:
        """Time the `events` data events of `data` (`[DONE]` is not a token)."""
        if b"[DONE]" in data:
            events -= 1
            self._done_sent = True
        if events > 0:
            self._time(events)

    def _time(self, events: int) -> None:
        """The first event ever is the TTFT; each later write is one gap, and the other events
        of the same write count as gaps of zero."""
        now = time.monotonic()
        if self._last_event_at is None:
            self._ttft.observe(now - self._started)
        else:
            self._itl.observe(now - self._last_event_at)
        for _ in range(events - 1):
            self._itl.observe(0.0)
        self._last_event_at = now


def merge_events(merger: StreamMerger, data: bytes) -> bytes:
    """Rewrite every `data:` line of complete SSE events with `merger`."""
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                lines[i] = b"data: " + merger.event(payload)
    return b"\n".join(lines)
