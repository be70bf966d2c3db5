"""The legs of a PD request: what one attempt sends to its prefill and its decode, the
connections that carry it, and the error each leg ends with.

1. `Legs.send` encodes what both legs send (`Send`): the route, the fixed headers, the body.
2. `Legs.send_now` puts a leg on an idle pooled connection at once; `Legs.open` sends it
   otherwise and waits for its response head; `Legs.read_leg` reads a whole non-streamed leg.
3. A `Leg` holds one leg's connection and why it must end early (its time limit, or its
   prefill's failure); a `Pair` binds the two legs of an attempt: the prefill read by a task,
   the decode by the handler.
4. Each failure maps to the error the client sees: `leg_error` (unreachable, timeout,
   transport), `Legs.decode_status` (the decode's own status), `Legs.expired` (a limit of the
   watchdog), `Legs.stream_failure` and `Legs.decode_failed` (which of those broke a decode).
5. `Legs.finish_in_background` lets a prefill still reading its answer finish after the
   response went out, and counts a late failure.

The legs go through `kit.lb.upstream` (the router's own HTTP/1.1 client); their time limits
are the watchdog's (a guard per leg, no timer per request).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from kit.lb.config import LbConfig, Role
from kit.lb.errors import ApiError, LegError
from kit.lb.metrics import LbMetrics
from kit.lb.prefill_queue import PrefillQueue
from kit.lb.upstream import Connection, Upstream, UpstreamError
from kit.lb.watchdog import Guard, Watchdog
from kit.lb.workers import Worker, WorkerPool


@dataclass(frozen=True, slots=True)
class Send:
    """What both legs of one attempt send: the route and the rest of the request after the
    Host line (headers, blank line), and the body."""

    path: bytes
    headers: bytes
    body: bytes


class Leg:
    """One leg's connection, and why it must end early: its time limit (the watchdog calls
    `expire`) or, for a decode, its prefill's failure (`fail`); the pending read raises it."""

    __slots__ = ("conn", "error", "started")

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()

    def attach(self, conn: Connection) -> Connection:
        """The leg's request went out on `conn`."""
        self.conn = conn
        if self.error is not None:
            conn.abort(self.error)
        return conn

    def fail(self, error: BaseException) -> None:
        """End the leg with `error` (the first one given), now or as its request goes out."""
        if self.error is None:
            self.error = error
        if self.conn is not None:
            self.conn.abort(self.error)

    def expire(self) -> None:
        self.fail(TimeoutError())


class Pair:
    """The two legs of one attempt: the prefill runs as a task, the decode in the handler; a
    failed prefill ends the decode leg (its pending read raises the prefill's error)."""

    __slots__ = ("decode", "guard", "prefill_error", "prefill_task", "prefill_url", "reported")

    def __init__(self, prefill_task: asyncio.Task[bytes], decode: Leg, prefill_url: str) -> None:
        self.prefill_task = prefill_task
        self.prefill_url = prefill_url
        self.decode = decode
        self.prefill_error: LegError | None = None
        self.reported = False  # the prefill's error reached the client (or was raised)
        self.guard: Guard | None = None  # streams: the watchdog's view of this attempt
        prefill_task.add_done_callback(self._prefill_done)

    def _prefill_done(self, task: asyncio.Task[bytes]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self.prefill_error = (
            exc
            if isinstance(exc, LegError)
            else LegError(
                502, f"prefill leg failed: {exc!r}", "prefill_transport", role="prefill", worker=""
            )
        )
        self.decode.fail(self.prefill_error)

    def expire(self) -> None:
        """The watchdog's verdict on a stream: stop waiting for the decode."""
        self.decode.expire()

    def take_error(self) -> LegError:
        """The prefill's error, now reported to the client (not to be counted again)."""
        if self.prefill_error is None:
            raise RuntimeError("no prefill error to report")
        self.reported = True
        return self.prefill_error

    def cancel(self) -> None:
        """Stop both legs: cancel the prefill's task, close the decode's connection."""
        if not self.prefill_task.done():
            self.prefill_task.cancel()
        if self.decode.conn is not None:
            self.decode.conn.close()


def leg_error(role: Role, worker: Worker, exc: BaseException) -> LegError:
    """Map a failure of one leg's exchange to the error the client sees."""
    if isinstance(exc, UpstreamError) and exc.unsent:
        return LegError(
            502,
            f"cannot reach {role} worker {worker.url}: {exc}",
            f"{role}_unreachable",
            role=role,
            worker=worker.url,
            unsent=True,
        )
    if isinstance(exc, TimeoutError):
        limit = "--prefill-timeout" if role == "prefill" else "--request-timeout"
        return LegError(
            504,
            f"{role} worker {worker.url} did not answer within {limit}",
            f"{role}_timeout",
            role=role,
            worker=worker.url,
        )
    return LegError(
        502,
        f"{role} worker {worker.url} failed: {exc}",
        f"{role}_transport",
        role=role,
        worker=worker.url,
    )


def first_event_error(first: bytes) -> int | None:
    """The status of a stream whose first event is an error (SGLang sends its failures after
    the 200 head: `data: {"error": {...}}` or `data: {"object": "error", ...}`), else None; a
    status under 500 counts as 500 only when the event names none."""
    head = first.lstrip()
    if not head.startswith(b"data:"):
        return None
    payload = head[5:].lstrip()
    if not (
        payload.startswith(b'{"error"')
        or payload.startswith(b'{"object":"error"')
        or payload.startswith(b'{"object": "error"')
    ):
        return None
    line = payload.split(b"\n", 1)[0]
    try:
        event = json.loads(line)
    except ValueError:
        return 502
    error = event.get("error", event) if isinstance(event, dict) else {}
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and 400 <= code <= 599 else 502


class Legs:
    """Sends and reads the legs of every request; one per load balancer, sharing its pool,
    upstream and watchdog. The time limits are seconds (None: no limit)."""

    def __init__(
        self,
        config: LbConfig,
        *,
        pool: WorkerPool,
        upstream: Upstream,
        metrics: LbMetrics,
        queue: PrefillQueue,
        worker_headers: dict[str, str],
        on_failure: Callable[[ApiError], None],
    ) -> None:
        self._config = config
        self._pool = pool
        self._upstream = upstream
        self._metrics = metrics
        self._queue = queue  # a prefill leg that ends hands on the next turn
        self._on_failure = on_failure  # logs worker trouble the client cannot be told about
        self._background: set[asyncio.Task[bytes]] = set()
        self.prefill_timeout = config.prefill_timeout or None
        self.request_timeout = config.request_timeout or None
        self.idle_timeout = config.idle_timeout or None
        self.first_token_timeout = config.first_token_timeout or self.idle_timeout
        self.stall_timeout = config.stall_after if config.migrate else self.idle_timeout
        self.watchdog = Watchdog(
            self.prefill_timeout,
            self.request_timeout,
            self.idle_timeout,
            self.first_token_timeout,
            self.stall_timeout,
        )
        fixed = {"Content-Type": "application/json", **worker_headers}
        self._fixed_headers = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")

    async def close(self) -> None:
        """Stop the watchdog; cancel prefill legs still finishing in the background."""
        await self.watchdog.close()
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def watch_stream(self, pair: Pair, decode: Worker) -> Guard:
        """Put a streamed decode leg under the watchdog (the request's whole time and its first
        token's) and count it in flight on `decode`; the caller releases the guard."""
        guard = pair.guard = self.watchdog.watch(
            pair.expire, total=self.request_timeout, idle=self.first_token_timeout
        )
        if not decode.inflight:
            decode.progress_at = guard.last  # a busy period begins
        decode.inflight += 1
        return guard

    def send(self, path: bytes, body: bytes, request_id: str) -> Send:
        """What both legs of an attempt send: `body` on the route `path`."""
        return Send(
            path,
            b"%sContent-Length: %d\r\nX-Request-Id: %s\r\n\r\n"
            % (self._fixed_headers, len(body), request_id.encode()),
            body,
        )

    def send_now(self, worker: Worker, send: Send) -> Connection | None:
        """Send a leg on an idle pooled connection at once (None: there is none)."""
        origin = self._upstream.origin(worker.url)
        try:
            return origin.send_now(
                origin.request_head(b"POST", send.path) + send.headers, send.body
            )
        except UpstreamError:
            return None  # the pooled connection was lost: `open` connects anew

    async def open(
        self, role: Role, worker: Worker, send: Send, leg: Leg, conn: Connection | None = None
    ) -> Connection:
        """Send one leg (unless `conn` already carries it) and wait for its response head;
        LegError on failure (the prefill's own error, for a decode it failed)."""
        worker.requests += 1
        if conn is None:
            conn = self.send_now(worker, send)
        if conn is None:
            origin = self._upstream.origin(worker.url)
            try:
                head = origin.request_head(b"POST", send.path) + send.headers
                conn = await origin.send(head, send.body)
            except UpstreamError as exc:
                raise leg_error(role, worker, exc) from exc
        leg.attach(conn)
        try:
            await conn.head()
        except (UpstreamError, TimeoutError) as exc:
            conn.close()
            raise leg_error(role, worker, exc) from exc
        except BaseException:
            conn.close()
            raise
        if worker.connection_errors:
            self._pool.record_success(worker)
        return conn

    async def read_leg(
        self,
        role: Role,
        worker: Worker,
        send: Send,
        limit: float | None,
        *,
        leg: Leg,
        conn: Connection | None = None,
    ) -> tuple[int, str, bytes]:
        """One whole non-streamed leg: (status, content type, body)."""
        if not worker.inflight:
            worker.progress_at = leg.started  # a busy period begins
        worker.inflight += 1
        guard = self.watchdog.watch(leg.expire, total=limit)
        try:
            conn = await self.open(role, worker, send, leg, conn)
            try:
                data = await conn.read()
            except (UpstreamError, TimeoutError) as exc:
                raise leg_error(role, worker, exc) from exc
            finally:
                conn.release()
            return conn.status, conn.content_type, data
        finally:
            self.watchdog.release(guard)
            worker.inflight -= 1
            worker.progress_at = time.monotonic()
            if role == "prefill":
                self._queue.next_turn()

    def finish_in_background(self, pair: Pair) -> None:
        """Let a prefill leg that is still reading its answer finish; count a late failure."""
        task = pair.prefill_task
        if task.done():
            if not pair.reported:
                self._late_failure(task)
            return
        self._background.add(task)
        task.add_done_callback(self._late_failure)

    def _late_failure(self, task: asyncio.Task[bytes]) -> None:
        self._background.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        error = exc if isinstance(exc, ApiError) else ApiError(502, repr(exc), "prefill_transport")
        self._metrics.error(error.cause)
        self._on_failure(error)

    def decode_failed(self, pair: Pair, decode: Worker, error: LegError) -> ApiError:
        """The error for a decode leg that failed before anything reached the client: the
        prefill's own (reported now), a stream's limit, or the decode's."""
        if error is pair.prefill_error:
            return pair.take_error()
        if pair.guard is not None and pair.guard.expired:
            return self.expired(pair.guard, decode)
        return error

    def stream_failure(self, pair: Pair, decode: Worker, exc: BaseException) -> ApiError:
        """Why a decode stream broke: a limit, the prefill's failure, or the decode itself."""
        if pair.guard is not None and pair.guard.expired:
            return self.expired(pair.guard, decode)
        if pair.prefill_error is not None:
            return pair.take_error()
        return leg_error("decode", decode, exc)

    def expired(self, guard: Guard, decode: Worker) -> ApiError:
        """The error for a stream the watchdog stopped."""
        if guard.expired == "total":
            limit = self._config.request_timeout
            return ApiError(
                504, f"the request took longer than --request-timeout {limit:g} s", "timeout"
            )
        config = self._config
        if guard.idle == self.first_token_timeout and guard.idle != self.stall_timeout:
            flag = "--first-token-timeout" if config.first_token_timeout else "--idle-timeout"
        elif config.migrate:
            flag = "--stall-timeout"
        else:
            flag = "--idle-timeout"
        return LegError(
            504,
            f"decode worker {decode.url} sent nothing for {guard.idle or 0:g} s ({flag})",
            "decode_stalled" if flag == "--stall-timeout" else "decode_timeout",
            role="decode",
            worker=decode.url,
        )

    def decode_status(
        self, pair: Pair, decode: Worker, status: int, content_type: str, data: bytes
    ) -> LegError:
        """A decode's own error status (or a stream's first event that is an error). A 5xx
        that came while the prefill leg had not ended blames the prefill: SGLang's decode
        reports a prefill it lost ("Lost connection with prefill instance") as a 500. A 503
        is the decode's own refusal (starting, shutting down, no KV to reclaim), so it
        blames the decode: blamed on the prefill, the retry would leave out the prefill and
        could go back to the refusing decode."""
        pending = not pair.prefill_task.done() and status != HTTPStatus.SERVICE_UNAVAILABLE
        snippet = data[:300].decode("utf-8", "replace")
        return LegError(
            status,
            f"decode worker {decode.url} answered {status}: {snippet}",
            "decode_status",
            role="decode",
            worker=decode.url,
            raw_body=data if data.lstrip().startswith(b"{") else None,
            raw_content_type=content_type or "application/json",
            blame=pair.prefill_url if pending else None,
        )

    async def read_error(self, pair: Pair, decode: Worker, upstream: Connection) -> bytes:
        """The body of a decode's error status; what broke the stream if it cannot be read."""
        try:
            return await upstream.read()
        except (UpstreamError, TimeoutError, LegError) as exc:
            raise self.stream_failure(pair, decode, exc) from exc
