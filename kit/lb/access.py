"""The access log: one line per PD request, `access {json}`, by logger `kit.lb.access` at INFO.

The JSON object (`pdkit trace` reads it; times in ms, None as null):

    ts              epoch seconds when the request arrived
    id              request id (the client's X-Request-Id, else the one the router made up)
    route           /generate, /v1/completions or /v1/chat/completions
    status          HTTP status answered (499: the client went away first)
    stream          whether the answer was streamed
    prefill, decode URLs of the workers of the last attempt ("" when none was chosen)
    bootstrap_room  the room of the last attempt (null when none)
    queued_ms       arrival to both legs sent (admission, retries on other workers)
    prefill_ms      the prefill leg: sent to its answer's end
    decode_ms       the decode leg: sent to its answer's (or stream's) end
    ttft_ms         streams: arrival to the first token event written to the client
    e2e_ms          arrival to the answer's end
    tokens          streams: token events relayed (`[DONE]` not counted)
    cause           why the request failed (a metrics cause label), else ""
    admission       "admitted", "rejected:REASON" (ttft, tpot), "off", or "skipped" (admission
                    is on but the request failed before it was judged: a bad body, a key)
    retries         attempts sent again on a fresh pair before the client got a byte
    migrations      times the stream was continued on another pair (its decode died or stalled)
    held_ms         time spent waiting for a worker of a role that had none routable
    dp_rank         cache_aware: the prefill DP rank chosen through the room (null: left to
                    chance, or another policy)
    cached_predicted  cache_aware: prompt tokens the router's KV-event index expected the
                    prefill to have cached (null: no prediction), pending blocks included
    cached_pending  cache_aware: of those, tokens in blocks still pending there (sent there
                    by this router for earlier requests, not reported by its events yet)
    cached_actual   cache_aware: the prefill's own count (its meta_info cached_tokens)
    prompt_tokens   the prompt's token count where the router knows its ids (its tokenizer,
                    or ids the client sent), else null
    poison          the body's fingerprint when a prefill died under it or the poison rule
                    refused it (kit.lb.poison), else ""

The line is built by hand (no json.dumps per request) from values that need no escaping: the
request id is checked when it is read (kit.lb.exchange.client_request_id), worker URLs are
escaped once. `pdkit lb` sends the logger to stderr through `BatchedHandler`, which writes
lines in batches (every `FLUSH_INTERVAL` s or `FLUSH_BYTES`), not one write per request;
embedded (tests), records go wherever logging sends them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from kit.lb.exchange import Exchange

ACCESS = logging.getLogger("kit.lb.access")

FLUSH_INTERVAL = 0.2
FLUSH_BYTES = 64 * 1024

_LINE = (
    'access {"ts":%.3f,"id":"%s","route":"%s","status":%d,"stream":%s,"prefill":%s,'
    '"decode":%s,"bootstrap_room":%s,"queued_ms":%s,"prefill_ms":%s,"decode_ms":%s,'
    '"ttft_ms":%s,"e2e_ms":%.3f,"tokens":%s,"cause":"%s","admission":"%s",'
    '"retries":%d,"migrations":%d,"held_ms":%.3f,"dp_rank":%s,"cached_predicted":%s,'
    '"cached_pending":%s,"cached_actual":%s,"prompt_tokens":%s,"poison":"%s"}'
)


def _int_or_null(value: int | None) -> str:
    return "null" if value is None or value < 0 else str(value)


def _ms(seconds: float | None) -> str:
    return "null" if seconds is None else "%.3f" % (seconds * 1000)


class AccessLog:
    """Formats and writes access lines (`enabled` false: the server writes none)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._quoted: dict[str, str] = {"": '""'}
        self._direct: BatchedHandler | None = None
        if enabled and not ACCESS.propagate:
            handlers = [h for h in ACCESS.handlers if isinstance(h, BatchedHandler)]
            if len(ACCESS.handlers) == 1 and handlers:
                self._direct = handlers[0]

    def _quote(self, url: str) -> str:
        quoted = self._quoted.get(url)
        if quoted is None:
            quoted = self._quoted[url] = json.dumps(url)
        return quoted

    def exchange(self, ex: Exchange, status: int, e2e: float) -> None:
        """The line of a request that reached dispatch (`e2e` in seconds)."""
        if not ACCESS.isEnabledFor(logging.INFO):
            return
        chosen = ex.path
        relay = ex.relay
        kv = ex.kv
        started = ex.started
        first = relay.first_at if relay is not None else None
        self._emit(
            _LINE
            % (
                time.time() - e2e,
                ex.request_id,
                ex.pd.path,
                status,
                "true" if ex.pd.stream else "false",
                self._quote(chosen.prefill) if chosen else '""',
                self._quote(chosen.decode) if chosen else '""',
                chosen.bootstrap_room if chosen else "null",
                _ms(None if ex.sent_at is None else ex.sent_at - started),
                _ms(ex.prefill_s),
                _ms(ex.decode_s),
                _ms(None if first is None else first - started),
                e2e * 1000,
                relay.events if relay is not None else "null",
                ex.cause,
                ex.admission,
                ex.retries,
                ex.migrations,
                ex.held_s * 1000,
                _int_or_null(kv.dp_rank if kv is not None else None),
                _int_or_null(kv.predicted if kv is not None else None),
                _int_or_null(kv.pending if kv is not None and kv.predicted >= 0 else None),
                _int_or_null(ex.cached_actual),
                _int_or_null(None if ex.pd.ids is None else len(ex.pd.ids)),
                ex.poison,
            )
        )

    def refused(
        self,
        request_id: str,
        route: str,
        *,
        status: int,
        stream: bool,
        e2e: float,
        cause: str,
        admission: str,
    ) -> None:
        """The line of a request refused before dispatch (a bad body or key, a drain)."""
        if not ACCESS.isEnabledFor(logging.INFO):
            return
        self._emit(
            _LINE
            % (
                time.time() - e2e,
                request_id,
                route,
                status,
                "true" if stream else "false",
                '""',
                '""',
                "null",
                "null",
                "null",
                "null",
                "null",
                e2e * 1000,
                "null",
                cause,
                admission,
                0,
                0,
                0.0,
                "null",
                "null",
                "null",
                "null",
                "null",
                "",
            )
        )

    def _emit(self, line: str) -> None:
        if self._direct is not None:
            self._direct.add(line)
        else:
            ACCESS.info("%s", line)


class BatchedHandler(logging.Handler):
    """Writes formatted records to `stream` in batches: when `FLUSH_BYTES` are pending, else
    at most `FLUSH_INTERVAL` s after the first pending line (from the running event loop; with
    none, at once). `close()` and `flush()` write what is pending."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self._stream = stream
        self._lines: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.add(self.format(record))
        except Exception:
            self.handleError(record)

    def add(self, line: str) -> None:
        """Queue one line (no trailing newline)."""
        self._lines.append(line)
        self._size += len(line) + 1
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_INTERVAL, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        lines, self._lines, self._size = self._lines, [], 0
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed: nothing left to tell
            pass

    def close(self) -> None:
        self.flush()
        super().close()


def send_to(stream: IO[str]) -> BatchedHandler:
    """Route the access log to `stream` in batches, as bare `access {json}` lines (not through
    the root logger's format); returns the handler (flushed on exit by logging)."""
    handler = BatchedHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    ACCESS.addHandler(handler)
    ACCESS.setLevel(logging.INFO)
    ACCESS.propagate = False
    return handler
