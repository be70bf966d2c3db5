"""Dual dispatch: one PD request to a prefill and a decode, concurrently, and the answer back.

For each attempt: choose a prefill and a decode, encode the body once with fresh bootstrap
fields, send it to both on the same path, and answer with the decode's response. The legs are
bound by a `_Pair`: the prefill's answer is read by a task, the decode's by the handler itself
(one task and one loop turn fewer per request); a prefill that fails ends the decode leg (which
would otherwise wait for KV that never comes) with the prefill's error; a decode that fails
cancels the prefill; a client that goes away cancels the handler and with it both legs
(closing an upstream connection makes SGLang abort the request). On pooled connections both
requests go out at once, the prefill's first.

Retries: an attempt that fails before anything reached the client (a worker unreachable or
resetting the connection, a 5xx or an error event as a stream's first bytes, a transfer failure,
no first token within --first-token-timeout) is sent again on a freshly chosen pair (workers
that failed in this request are avoided while others are routable) with new rooms, within the
request's budget (`retries`) and deadline (`retry_deadline`). Never after the first byte
reached the client, never for a client that went away (its task is cancelled), never for a
4xx that the worker meant. Each failure counts against the worker it blames (outlier
ejection, `WorkerPool.record_failure`). For streams the response is committed at the decode's
first bytes, which come after the prefill is done, so a failing prefill still gets a clean HTTP
error (or a retry) instead of a broken stream; a stream cut later is migrated
(`kit.lb.migrate`).

Hold: a request that finds no routable worker of a role waits for one up to `hold_timeout` s
(at most `hold_max` requests at once), then gets a 503 with Retry-After.

The legs go through `kit.lb.upstream` (the router's own HTTP/1.1 client); their time limits
are the watchdog's (a guard per leg, no timer per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from kit.lb import migrate
from kit.lb.admission import (
    PRIORITIES,
    PRIORITY_HEADER,
    Admission,
    Priority,
    Rejection,
    Ticket,
    prompt_tokens,
)
from kit.lb.cache_aware import CacheAware, Choice
from kit.lb.config import LbConfig, Role
from kit.lb.errors import ApiError, LegError
from kit.lb.exchange import Exchange, client_request_id, path_headers
from kit.lb.hold import Hold
from kit.lb.logprobs import StreamMerger, merge_body
from kit.lb.metrics import LbMetrics
from kit.lb.policies import Policy
from kit.lb.prefill_queue import PrefillQueue
from kit.lb.protocol import Merge, PdRequest, affinity_key
from kit.lb.recent import PathRecord, RecentRequests
from kit.lb.stream import ClientGone, StreamRelay
from kit.lb.upstream import Connection, Upstream, UpstreamError
from kit.lb.watchdog import Guard, Watchdog
from kit.lb.workers import Worker, WorkerPool

log = logging.getLogger("kit.lb.dispatch")


@dataclass(frozen=True, slots=True)
class _Send:
    """What both legs of one attempt send: the route and the rest of the request after the
    Host line (headers, blank line), and the body."""

    path: bytes
    headers: bytes
    body: bytes


class _Leg:
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
        if self.error is None:
            self.error = error
        if self.conn is not None:
            self.conn.abort(self.error)

    def expire(self) -> None:
        self.fail(TimeoutError())


class _Pair:
    """The two legs of one attempt: the prefill runs as a task, the decode in the handler; a
    failed prefill ends the decode leg (its pending read raises the prefill's error)."""

    __slots__ = ("decode", "guard", "prefill_error", "prefill_task", "prefill_url", "reported")

    def __init__(self, prefill_task: asyncio.Task[bytes], decode: _Leg, prefill_url: str) -> None:
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
        if not self.prefill_task.done():
            self.prefill_task.cancel()
        if self.decode.conn is not None:
            self.decode.conn.close()


def _leg_error(role: Role, worker: Worker, exc: BaseException) -> LegError:
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


class Dispatcher:
    """Sends PD requests; one per load balancer, sharing its pool, policies and upstream."""

    def __init__(
        self,
        config: LbConfig,
        *,
        pool: WorkerPool,
        policies: dict[Role, Policy],
        upstream: Upstream,
        metrics: LbMetrics,
        rng: random.Random,
        worker_headers: dict[str, str],
        on_connection_error: Callable[[Worker, str], None],
        on_worker_failure: Callable[[Worker, str], None],
        on_failure: Callable[[ApiError], None],
        recent: RecentRequests,
        admission: Admission | None = None,
    ) -> None:
        self._config = config
        self._admission = admission
        self._pool = pool
        self._policies = policies
        self._upstream = upstream
        self._metrics = metrics
        self._rng = rng
        self._on_connection_error = on_connection_error
        self._on_worker_failure = on_worker_failure
        self._hold = Hold(config, pool, metrics)
        self._queue = PrefillQueue(config.prefill_max_inflight, pool, metrics)
        self._on_failure = on_failure  # logs worker trouble the client cannot be told about
        self._recent = recent
        self._background: set[asyncio.Task[bytes]] = set()
        self._prefill_timeout = config.prefill_timeout or None
        self._request_timeout = config.request_timeout or None
        self._idle_timeout = config.idle_timeout or None
        self._first_token_timeout = config.first_token_timeout or self._idle_timeout
        self._stall_timeout = config.stall_after if config.migrate else self._idle_timeout
        self._watchdog = Watchdog(
            self._prefill_timeout,
            self._request_timeout,
            self._idle_timeout,
            self._first_token_timeout,
            self._stall_timeout,
        )
        self._needs_key = any(p.needs_key for p in policies.values())
        prefill_policy = policies["prefill"]
        self._cache_aware = prefill_policy if isinstance(prefill_policy, CacheAware) else None
        fixed = {"Content-Type": "application/json", **worker_headers}
        self._fixed_headers = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")

    async def close(self) -> None:
        """Stop the watchdog; cancel prefill legs still finishing in the background."""
        await self._watchdog.close()
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- selection ---------------------------------------------------------------------------

    async def _pick(self, ex: Exchange, role: Role, key: bytes | None, exclude: set[str]) -> Worker:
        """A worker of `role` for the next attempt: one that has not failed in this request
        when there is such, else any routable one; with none routable, hold. A prefill has
        room (`--prefill-max-inflight`) where the limit is set. cache_aware also chooses the
        prefill's DP rank (`ex.kv`)."""
        workers = self._pool.routable(role)
        if not workers:
            workers = await self._hold.wait(ex, role, exclude)
        if exclude:
            workers = [w for w in workers if w.url not in exclude] or workers
        if role == "prefill" and self._config.prefill_max_inflight > 0:
            workers = self._queue.with_room(workers) or workers
        if role == "prefill" and self._cache_aware is not None:
            ex.kv = self._cache_aware.plan(workers, ex.pd, key)
            return ex.kv.worker
        return self._policies[role].choose(workers, key)

    # -- entry point -------------------------------------------------------------------------

    def request_id(self, request: web.BaseRequest) -> str:
        """The client's X-Request-Id when usable, else a new one (16 hex digits)."""
        return client_request_id(request.headers.get("X-Request-Id")) or (
            f"{self._rng.getrandbits(64):016x}"
        )

    def _priority(self, request: web.BaseRequest) -> Priority:
        value = request.headers.get(PRIORITY_HEADER)
        if value is None:
            return "normal"
        for priority in PRIORITIES:
            if value.strip().lower() == priority:
                return priority
        raise ApiError(
            400,
            f"{PRIORITY_HEADER} must be high, normal or low, got {value!r}",
            "bad_request",
            param=PRIORITY_HEADER,
        )

    def _admit(
        self,
        ex: Exchange,
        admission: Admission,
        *,
        prefill: Worker,
        decode: Worker,
        excluded: set[str],
        priority: Priority,
    ) -> Worker:
        """Admit the request (on `prefill` or a better one, returned) or raise the 429."""
        tokens = ex.ticket.tokens if ex.ticket else prompt_tokens(ex.pd.body, ex.pd.path)
        prefills = [w for w in self._pool.routable("prefill") if w.url not in excluded]
        verdict = admission.decide(prefill, prefills, decode, tokens, priority)
        if isinstance(verdict, Rejection):
            ex.admission = f"rejected:{verdict.reason}"
            self._metrics.reject(verdict.reason, priority)
            raise ApiError(
                429,
                verdict.message(priority),
                "rejected",
                headers={"Retry-After": str(verdict.retry_after)},
            )
        if ex.ticket is None:
            self._metrics.admit(priority)
        ex.ticket = verdict
        ex.admission = "admitted"
        verdict.model.started(tokens, time.monotonic())  # in the queue from now on
        return verdict.prefill

    async def dispatch(self, ex: Exchange) -> web.StreamResponse:
        """Answer one PD request (retrying unreachable workers); raises ApiError before commit
        (429 when admission refuses it)."""
        pd = ex.pd
        key = affinity_key(pd, self._config.prefix_chars) if self._needs_key else None
        if not ex.request_id:
            ex.request_id = self.request_id(ex.request)
        self._metrics.receive(prompt_tokens(pd.body, pd.path))
        admission = self._admission
        priority = self._priority(ex.request) if admission is not None else "normal"
        await self._queue.turn(ex)
        try:
            return await self._attempts(ex, pd, key, admission, priority)
        finally:
            self._queue.claim(ex, False)

    async def _attempts(
        self,
        ex: Exchange,
        pd: PdRequest,
        key: bytes | None,
        admission: Admission | None,
        priority: Priority,
    ) -> web.StreamResponse:
        """`dispatch`'s attempts: a pair, the request sent, a fresh pair after a failure."""
        excluded: set[str] = set()
        deadline = ex.started + self._config.retry_deadline
        while True:
            prefill = await self._pick(ex, "prefill", key, excluded)
            decode = await self._pick(ex, "decode", key, excluded)
            if admission is not None:
                prefill = self._admit(
                    ex,
                    admission,
                    prefill=prefill,
                    decode=decode,
                    excluded=excluded,
                    priority=priority,
                )
            choice = ex.kv
            if choice is not None and choice.worker is not prefill:  # admission moved it
                choice = ex.kv = Choice(prefill, None, 1, choice.prompt_tokens, -1)
            rank = None
            if choice is not None and choice.dp_rank is not None:
                rank = (choice.dp_rank, choice.dp_size)
            body, room = pd.encode(
                prefill.bootstrap_host, prefill.bootstrap_port, self._rng, dp_rank=rank
            )
            if choice is not None and self._cache_aware is not None:
                self._cache_aware.begin(choice)
            ex.path = PathRecord(ex.request_id, pd.path, prefill.url, decode.url, room, ex.started)
            self._recent.chose(ex.path)
            send = self._send(pd.path_bytes, body, ex.request_id)
            try:
                if pd.stream:
                    return await self._stream(ex, prefill, decode, send)
                return await self._unary(ex, prefill, decode, send)
            except LegError as error:
                worker = prefill if error.blame == prefill.url else decode
                self._blame(worker, error)
                excluded.add(worker.url)
                if not self._may_retry(ex, error, deadline):
                    raise
                ex.causes.append(error.cause)
                ex.retries += 1
                self._metrics.retry(error.role)
                log.info("sending again on a fresh pair: %s", error.message)

    def _send(self, path: bytes, body: bytes, request_id: str) -> _Send:
        return _Send(
            path,
            b"%sContent-Length: %d\r\nX-Request-Id: %s\r\n\r\n"
            % (self._fixed_headers, len(body), request_id.encode()),
            body,
        )

    def _blame(self, worker: Worker, error: LegError) -> None:
        """Count a failed leg against the worker it blames (a 4xx is the request's fault)."""
        if error.unsent:
            self._on_connection_error(worker, str(error))
        elif error.retryable:
            self._on_worker_failure(worker, error.message)

    def _may_retry(self, ex: Exchange, error: LegError, deadline: float) -> bool:
        """Whether a failed attempt is sent again: nothing reached the client, the failure is
        the worker's (not a 4xx), and the budget and deadline allow."""
        return (
            ex.out is None
            and error.retryable
            and ex.retries + ex.migrations < self._config.retries
            and time.monotonic() < deadline
        )

    # -- legs --------------------------------------------------------------------------------

    def _send_now(self, worker: Worker, send: _Send) -> Connection | None:
        """Send a leg on an idle pooled connection at once (None: there is none)."""
        origin = self._upstream.origin(worker.url)
        try:
            return origin.send_now(
                origin.request_head(b"POST", send.path) + send.headers, send.body
            )
        except UpstreamError:
            return None  # the pooled connection was lost: `_open` connects anew

    async def _open(
        self, role: Role, worker: Worker, send: _Send, leg: _Leg, conn: Connection | None = None
    ) -> Connection:
        """Send one leg (unless `conn` already carries it) and wait for its response head;
        LegError on failure (the prefill's own error, for a decode it failed)."""
        worker.requests += 1
        if conn is None:
            conn = self._send_now(worker, send)
        if conn is None:
            origin = self._upstream.origin(worker.url)
            try:
                head = origin.request_head(b"POST", send.path) + send.headers
                conn = await origin.send(head, send.body)
            except UpstreamError as exc:
                raise _leg_error(role, worker, exc) from exc
        leg.attach(conn)
        try:
            await conn.head()
        except (UpstreamError, TimeoutError) as exc:
            conn.close()
            raise _leg_error(role, worker, exc) from exc
        except BaseException:
            conn.close()
            raise
        if worker.connection_errors:
            self._pool.record_success(worker)
        return conn

    async def _read_leg(
        self,
        role: Role,
        worker: Worker,
        send: _Send,
        limit: float | None,
        *,
        leg: _Leg,
        conn: Connection | None = None,
    ) -> tuple[int, str, bytes]:
        """One whole non-streamed leg: (status, content type, body)."""
        if not worker.inflight:
            worker.progress_at = leg.started  # a busy period begins
        worker.inflight += 1
        guard = self._watchdog.watch(leg.expire, total=limit)
        try:
            conn = await self._open(role, worker, send, leg, conn)
            try:
                data = await conn.read()
            except (UpstreamError, TimeoutError) as exc:
                raise _leg_error(role, worker, exc) from exc
            finally:
                conn.release()
            return conn.status, conn.content_type, data
        finally:
            self._watchdog.release(guard)
            worker.inflight -= 1
            worker.progress_at = time.monotonic()
            if role == "prefill":
                self._queue.next_turn()

    async def _prefill_leg(
        self, ex: Exchange, worker: Worker, send: _Send, keep: bool, conn: Connection | None
    ) -> bytes:
        leg = _Leg()
        self._queue.claim(ex, False)  # its slot is taken for real now (worker.inflight)
        # This attempt's choice: a retry replaces ex.kv while this leg may still be finishing.
        choice = ex.kv if ex.kv is not None and ex.kv.worker is worker else None
        status = 0
        try:
            status, content_type, data = await self._read_leg(
                "prefill", worker, send, self._prefill_timeout, leg=leg, conn=conn
            )
        finally:
            ex.prefill_end = time.monotonic()
            ex.prefill_s = ex.prefill_end - leg.started
            if choice is not None and self._cache_aware is not None:
                self._cache_aware.end(choice, served=0 < status < 300)
        if status < 300 and choice is not None and choice is ex.kv:
            self._observe_cached(ex, data)
        if status >= 300:
            snippet = data[:300].decode("utf-8", "replace")
            raise LegError(
                status,
                f"prefill worker {worker.url} answered {status}: {snippet}",
                "prefill_status",
                role="prefill",
                worker=worker.url,
                raw_body=data,
                raw_content_type=content_type,
            )
        if worker.failures:
            self._pool.record_served(worker)
        return data if keep else b""

    def _observe_cached(self, ex: Exchange, data: bytes) -> None:
        """The prefill's own count of cached prompt tokens (its meta_info), against the
        prediction."""
        found = _CACHED_TOKENS.findall(data)
        if not found or ex.kv is None:
            return
        ex.cached_actual = int(found[-1])
        if ex.kv.predicted >= 0 and self._cache_aware is not None:
            self._cache_aware.index.observed(
                ex.kv.worker.url, ex.kv.prompt_tokens, ex.kv.predicted, ex.cached_actual
            )

    def _start(self, ex: Exchange, prefill: Worker, send: _Send, keep: bool) -> _Pair:
        """Send the prefill leg (at once when a pooled connection is idle, so it goes out
        before the decode's) and let a task read its answer; the decode leg is the caller's."""
        conn = self._send_now(prefill, send)
        prefill_task = asyncio.create_task(self._prefill_leg(ex, prefill, send, keep, conn))
        if ex.ticket is not None:
            prefill_task.add_done_callback(lambda task: self._prefill_ended(ex, task))
        ex.sent_at = time.monotonic()
        return _Pair(prefill_task, _Leg(), prefill.url)

    def _prefill_ended(self, ex: Exchange, task: asyncio.Task[bytes]) -> None:
        """Admission's accounting of a prefill leg (started when admitted): it left the queue,
        and if it was served, how long it took against the prediction."""
        ticket = ex.ticket
        if ticket is None:
            return
        served = not task.cancelled() and task.exception() is None
        ticket.model.ended(ticket.tokens, time.monotonic(), served)
        if served and not ex.pd.stream and ticket.prefill_done and ex.prefill_s is not None:
            self._metrics.ttft_error.observe(ex.prefill_s / ticket.prefill_done)

    def _finish_in_background(self, pair: _Pair) -> None:
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

    def _decode_failed(self, pair: _Pair, decode: Worker, error: LegError) -> ApiError:
        """The error for a decode leg that failed before anything reached the client: the
        prefill's own (reported now), a stream's limit, or the decode's."""
        if error is pair.prefill_error:
            return pair.take_error()
        if pair.guard is not None and pair.guard.expired:
            return self._expired(pair.guard, decode)
        return error

    # -- non-streaming -----------------------------------------------------------------------

    async def _unary(
        self, ex: Exchange, prefill: Worker, decode: Worker, send: _Send
    ) -> web.StreamResponse:
        pd = ex.pd
        keep = pd.merge is not Merge.NONE
        pair = self._start(ex, prefill, send, keep)
        finished = False
        try:
            leg = pair.decode
            try:
                status, content_type, data = await self._read_leg(
                    "decode", decode, send, self._request_timeout, leg=leg
                )
            except LegError as error:
                raise self._decode_failed(pair, decode, error) from None
            finally:
                ex.decode_s = time.monotonic() - leg.started
            if status >= 500:
                raise self._decode_status(pair, decode, status, content_type, data)
            if status >= 300:
                pair.cancel()
                ex.causes.append("decode_status")
            elif keep:
                prefill_data = await pair.prefill_task
                data = merge_body(pd.merge, prefill_data, data)
            finished = True
            if status < 300 and decode.failures:
                self._pool.record_served(decode)
            self._finish_in_background(pair)
            return web.Response(
                body=data,
                status=status,
                headers=self._response_headers(ex, content_type or "application/json"),
            )
        finally:
            if not finished:
                pair.cancel()

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(
        self, ex: Exchange, prefill: Worker, decode: Worker, send: _Send
    ) -> web.StreamResponse:
        pd = ex.pd
        keep = pd.merge is not Merge.NONE
        pair = self._start(ex, prefill, send, keep)
        guard = pair.guard = self._watchdog.watch(
            pair.expire, total=self._request_timeout, idle=self._first_token_timeout
        )
        if not decode.inflight:
            decode.progress_at = guard.last  # a busy period begins
        decode.inflight += 1
        finished = False
        upstream: Connection | None = None
        try:
            try:
                upstream = await self._open("decode", decode, send, pair.decode)
            except LegError as error:
                raise self._decode_failed(pair, decode, error) from None
            if upstream.status >= 300:
                data = await self._read_error(pair, decode, upstream)
                if upstream.status >= 500:
                    raise self._decode_status(
                        pair, decode, upstream.status, upstream.content_type, data
                    )
                pair.cancel()
                ex.causes.append("decode_status")
                finished = True
                return web.Response(
                    body=data,
                    status=upstream.status,
                    headers=self._response_headers(ex, upstream.content_type or "application/json"),
                )
            merger = None
            if keep:
                merger = StreamMerger(pd.merge, await pair.prefill_task)
            try:
                first = await upstream.first()
            except (UpstreamError, TimeoutError, LegError) as exc:
                raise self._stream_failure(pair, decode, exc) from None
            failed = first_event_error(first)
            if failed is not None and failed >= 500:  # a 4xx event is the worker's verdict
                with contextlib.suppress(UpstreamError, TimeoutError, LegError):
                    first += await upstream.read()
                raise self._decode_status(pair, decode, failed, "application/json", first)
            guard.idle = self._stall_timeout
            out = web.StreamResponse(
                status=upstream.status,
                headers=self._response_headers(ex, upstream.content_type or "text/event-stream"),
            )
            out.headers["Cache-Control"] = "no-cache"
            out.headers["X-Accel-Buffering"] = "no"
            await out.prepare(ex.request)
            ex.out = out
            ttft, itl = self._metrics.stream_timers(pd.path)
            relay = StreamRelay(
                out,
                ex.request,
                started=ex.started,
                ttft=ttft,
                itl=itl,
                guard=guard,
                worker=decode,
                merger=merger,
            )
            ex.relay = relay
            batch = decode.inflight
            try:
                await relay.run(upstream, first)
            except ClientGone:
                ex.causes.append("client_disconnect")
                return out
            except (UpstreamError, TimeoutError, LegError) as exc:
                cut = self._stream_failure(pair, decode, exc)
                pair.cancel()  # a stalled leg is cancelled before the stream moves on
                if isinstance(cut, LegError):
                    self._blame(decode, cut)
                try:
                    failure = await self._migrate(ex, relay, cut)
                except ClientGone:
                    ex.causes.append("client_disconnect")
                    return out
                if failure is not None:
                    ex.causes.append(failure.cause)
                    ex.cause = failure.cause
                    self._on_failure(failure)
                    try:
                        await relay.fail(failure)
                    except ClientGone:
                        ex.causes.append("client_disconnect")
            else:
                if decode.failures:
                    self._pool.record_served(decode)
                if ex.ticket is not None and not ex.migrations:
                    self._learn(ex, ex.ticket, relay, decode, (batch + decode.inflight) / 2)
            finished = True
            self._finish_in_background(pair)
            return out
        finally:
            self._watchdog.release(guard)
            decode.inflight -= 1
            ex.decode_s = time.monotonic() - pair.decode.started
            if not finished:
                pair.cancel()
            elif upstream is not None:
                upstream.release()

    # -- migration ---------------------------------------------------------------------------

    def _migration_refusal(self, ex: Exchange, cut: ApiError) -> tuple[str, str] | None:
        """(label, why) when a cut stream is not continued; None when it is."""
        if not self._config.migrate:
            return "off", "migration is off (--no-migrate)"
        if not isinstance(cut, LegError) or cut.role != "decode" or not cut.retryable:
            return "limit", "the request ran out of time"
        if ex.retries + ex.migrations >= self._config.retries:
            return "budget", f"the request used its {self._config.retries} retries (--retries)"
        why = migrate.refusal(ex.pd)
        if why is not None:
            return "inexact", f"a continuation would not be exact: {why}"
        return None

    async def _migrate(self, ex: Exchange, relay: StreamRelay, cut: ApiError) -> ApiError | None:
        """Continue a stream whose decode died or stalled on fresh pairs, with the prompt
        plus the tokens the client got (`kit.lb.migrate`); None when the stream ended well,
        else the error its last event reports. ClientGone when the client left."""
        excluded = {cut.blame} if isinstance(cut, LegError) else set()
        while True:
            refused = self._migration_refusal(ex, cut)
            if refused is not None:
                label, why = refused
                self._metrics.migration_refused(label)
                return ApiError(
                    cut.status, f"{cut.message}; the stream was not continued: {why}", cut.cause
                )
            sent = migrate.sent_so_far(ex.pd, relay.last_data)
            following = migrate.continuation(ex.pd, sent)
            if following is None:  # every token was sent: only the end was missing
                await relay.finish()
                return None
            ex.migrations += 1
            self._metrics.migrate("stalled" if cut.cause == "decode_stalled" else "died")
            log.info("continuing a stream on another pair: %s", cut.message)
            try:
                prefill = await self._pick(ex, "prefill", None, excluded)
                decode = await self._pick(ex, "decode", None, excluded)
            except ApiError as error:
                return ApiError(
                    error.status,
                    f"{cut.message}; the stream could not be continued: {error.message}",
                    error.cause,
                )
            body, room = following.encode(prefill.bootstrap_host, prefill.bootstrap_port, self._rng)
            ex.path = PathRecord(
                ex.request_id, ex.pd.path, prefill.url, decode.url, room, ex.started
            )
            self._recent.chose(ex.path)
            send = self._send(ex.pd.path_bytes, body, ex.request_id)
            try:
                await self._continue(
                    ex,
                    relay,
                    prefill=prefill,
                    decode=decode,
                    send=send,
                    rejoin=migrate.Rejoin(sent),
                )
                return None
            except LegError as error:
                worker = prefill if error.blame == prefill.url else decode
                self._blame(worker, error)
                excluded.add(worker.url)
                cut = error
            except ApiError as error:
                return error

    async def _continue(
        self,
        ex: Exchange,
        relay: StreamRelay,
        *,
        prefill: Worker,
        decode: Worker,
        send: _Send,
        rejoin: migrate.Rejoin,
    ) -> None:
        """One attempt at the rest of a stream: both legs, then the new decode's events
        rewritten into the client's stream; raises the attempt's error (LegError)."""
        pair = self._start(ex, prefill, send, False)
        guard = pair.guard = self._watchdog.watch(
            pair.expire, total=self._request_timeout, idle=self._first_token_timeout
        )
        if not decode.inflight:
            decode.progress_at = guard.last
        decode.inflight += 1
        finished = False
        upstream: Connection | None = None
        try:
            try:
                upstream = await self._open("decode", decode, send, pair.decode)
            except LegError as error:
                raise self._decode_failed(pair, decode, error) from None
            try:
                if upstream.status >= 300:
                    data = await upstream.read()
                    raise self._decode_status(
                        pair, decode, upstream.status, upstream.content_type, data
                    )
                first = await upstream.first()
                failed = first_event_error(first)
                if failed is not None:
                    raise self._decode_status(pair, decode, failed, "application/json", first)
                guard.idle = self._stall_timeout
                relay.rebind(guard, decode, rejoin)
                await relay.run(upstream, first)
            except (UpstreamError, TimeoutError) as exc:
                raise self._stream_failure(pair, decode, exc) from None
            except LegError as exc:
                if exc is pair.prefill_error or pair.guard.expired:
                    raise self._stream_failure(pair, decode, exc) from None
                raise
            if decode.failures:
                self._pool.record_served(decode)
            finished = True
            self._finish_in_background(pair)
        finally:
            self._watchdog.release(guard)
            decode.inflight -= 1
            if not finished:
                pair.cancel()
            elif upstream is not None:
                upstream.release()

    def _learn(
        self, ex: Exchange, ticket: Ticket, relay: StreamRelay, decode: Worker, batch: float
    ) -> None:
        """What a finished stream teaches admission: the gap from the prefill's end to the first
        token, the decode's step time at its batch, and how far off the predictions were."""
        admission = self._admission
        first, last = relay.first_at, relay.last_at
        if admission is None or first is None or last is None:
            return
        admission.first_token(ticket, ex.prefill_end, first)
        admission.stream_ended(decode, batch, relay.events, first, last)
        if ticket.ttft:
            self._metrics.ttft_error.observe((first - ex.started) / ticket.ttft)
        if ticket.tpot and relay.events > 1:
            tpot = (last - first) / (relay.events - 1)
            self._metrics.tpot_error.observe(tpot / ticket.tpot)

    def _expired(self, guard: Guard, decode: Worker) -> ApiError:
        """The error for a stream the watchdog stopped."""
        if guard.expired == "total":
            limit = self._config.request_timeout
            return ApiError(
                504, f"the request took longer than --request-timeout {limit:g} s", "timeout"
            )
        config = self._config
        if guard.idle == self._first_token_timeout and guard.idle != self._stall_timeout:
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

    def _stream_failure(self, pair: _Pair, decode: Worker, exc: BaseException) -> ApiError:
        """Why a decode stream broke: a limit, the prefill's failure, or the decode itself."""
        if pair.guard is not None and pair.guard.expired:
            return self._expired(pair.guard, decode)
        if pair.prefill_error is not None:
            return pair.take_error()
        return _leg_error("decode", decode, exc)

    def _decode_status(
        self, pair: _Pair, decode: Worker, status: int, content_type: str, data: bytes
    ) -> LegError:
        """A decode's own error status (or a stream's first event that is an error). One
        that came while the prefill leg had not ended blames the prefill: SGLang's decode
        reports a prefill it lost ("Lost connection with prefill instance")."""
        pending = not pair.prefill_task.done()
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

    async def _read_error(self, pair: _Pair, decode: Worker, upstream: Connection) -> bytes:
        try:
            return await upstream.read()
        except (UpstreamError, TimeoutError, LegError) as exc:
            raise self._stream_failure(pair, decode, exc) from exc

    def _response_headers(self, ex: Exchange, content_type: str) -> dict[str, str]:
        return {"Content-Type": content_type, **path_headers(ex)}


_CACHED_TOKENS = re.compile(rb'"cached_tokens":\s*(\d+)')


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
