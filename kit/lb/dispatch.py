"""Dual dispatch: one PD request to a prefill and a decode, concurrently, and the answer back.

A request's path (`Dispatcher.dispatch`), each attempt from step 2:

1. Its turn: with --prefill-max-inflight, it waits behind the requests that came first until a
   prefill has room (`kit.lb.prefill_queue`).
2. Pick: a prefill and a decode by the roles' policies (`pick`), avoiding the workers that
   failed in this request, and the pairs the token canary found wrong (`kit.lb.canary`),
   while others are routable; with no routable worker of a role it
   waits for one (`kit.lb.hold`). cache_aware also chooses the prefill's DP rank.
3. Admit: with admission on, the request is admitted on that prefill or a better one, or
   refused with a 429 (`kit.lb.admission`).
4. Send: the body is encoded once with fresh bootstrap fields and sent to both on the same
   path (`kit.lb.legs`); on pooled connections both requests go out at once, the prefill's
   first.
5. The prefill leg: its answer is read by a task (`start`); a prefill that fails ends the
   decode leg (which would otherwise wait for KV that never comes) with the prefill's error.
6. The decode leg: read by the handler itself (one task and one loop turn fewer per
   request); a decode that fails cancels the prefill; a client that goes away cancels the
   handler and with it both legs (closing an upstream connection makes SGLang abort the
   request).
7. Relay: the answer is the decode's response. A stream is committed at the decode's first
   bytes, which come after the prefill is done, so a failing prefill still gets a clean HTTP
   error (or a retry) instead of a broken stream; its events are relayed as they come
   (`kit.lb.stream`), and a stream cut later is continued on another pair (`kit.lb.migrate`).

Retries: an attempt that fails before anything reached the client (a worker unreachable or
resetting the connection, a 5xx or an error event as a stream's first bytes, a transfer failure,
no first token within --first-token-timeout) is sent again on a freshly chosen pair with new
rooms, within the request's budget (`retries`) and deadline (`retry_deadline`). Never after the
first byte reached the client, never for a client that went away (its task is cancelled), never
for a 4xx that the worker meant. Each failure counts against the worker it blames (outlier
ejection, `WorkerPool.record_failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from kit.lb.admission import (
    PRIORITIES,
    PRIORITY_HEADER,
    Admission,
    Priority,
    Rejection,
    Ticket,
    prompt_size,
)
from kit.lb.cache_aware import CacheAware, Choice
from kit.lb.config import LbConfig, Role
from kit.lb.errors import ApiError, LegError
from kit.lb.exchange import Exchange, client_request_id, path_headers
from kit.lb.hold import Hold
from kit.lb.legs import Leg, Legs, Pair, Send, first_event_error
from kit.lb.logprobs import StreamMerger, merge_body
from kit.lb.metrics import LbMetrics
from kit.lb.migrate import Migration
from kit.lb.policies import Policy
from kit.lb.prefill_queue import PrefillQueue
from kit.lb.protocol import Merge, PdRequest, affinity_key
from kit.lb.recent import PathRecord, RecentRequests
from kit.lb.stream import ClientGone, StreamRelay
from kit.lb.upstream import Connection, Upstream, UpstreamError
from kit.lb.workers import Worker, WorkerPool

log = logging.getLogger("kit.lb.dispatch")

_CACHED_TOKENS = re.compile(rb'"cached_tokens":\s*(\d+)')


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
        avoid: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self._config = config
        self._avoid = avoid if avoid is not None else {}  # the token canary's wrong pairs
        self._admission = admission
        self._pool = pool
        self._policies = policies
        self._metrics = metrics
        self._rng = rng
        self._on_connection_error = on_connection_error
        self._on_worker_failure = on_worker_failure
        self._hold = Hold(config, pool, metrics)
        self._queue = PrefillQueue(config.prefill_max_inflight, pool, metrics)
        self._legs = Legs(
            config,
            pool=pool,
            upstream=upstream,
            metrics=metrics,
            queue=self._queue,
            worker_headers=worker_headers,
            on_failure=on_failure,
        )
        self._on_failure = on_failure  # logs worker trouble the client cannot be told about
        self._recent = recent
        self._migration = Migration(
            config,
            pool=pool,
            metrics=metrics,
            recent=recent,
            rng=rng,
            legs=self._legs,
            pairs=self,
        )
        self._needs_key = any(p.needs_key for p in policies.values())
        prefill_policy = policies["prefill"]
        self._cache_aware = prefill_policy if isinstance(prefill_policy, CacheAware) else None

    async def close(self) -> None:
        """Stop the watchdog; cancel prefill legs still finishing in the background."""
        await self._legs.close()

    # -- selection ---------------------------------------------------------------------------

    async def pick(self, ex: Exchange, role: Role, key: bytes | None, exclude: set[str]) -> Worker:
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
        tokens = ex.ticket.tokens if ex.ticket else prompt_size(ex.pd)
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
        self._metrics.receive(prompt_size(pd))
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
            prefill = await self.pick(ex, "prefill", key, excluded)
            avoid = self._avoid.get(prefill.url)
            decode = await self.pick(ex, "decode", key, excluded | avoid if avoid else excluded)
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
            send = self._legs.send(pd.path_bytes, body, ex.request_id)
            try:
                if pd.stream:
                    return await self._stream(ex, prefill, decode, send)
                return await self._unary(ex, prefill, decode, send)
            except LegError as error:
                worker = prefill if error.blame == prefill.url else decode
                self.blame(worker, error)
                excluded.add(worker.url)
                if not self._may_retry(ex, error, deadline):
                    raise
                ex.causes.append(error.cause)
                ex.retries += 1
                self._metrics.retry(error.role)
                log.info("sending again on a fresh pair: %s", error.message)

    def blame(self, worker: Worker, error: LegError) -> None:
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

    # -- the prefill leg ---------------------------------------------------------------------

    def start(self, ex: Exchange, prefill: Worker, send: Send, keep: bool) -> Pair:
        """Send the prefill leg (at once when a pooled connection is idle, so it goes out
        before the decode's) and let a task read its answer; the decode leg is the caller's."""
        conn = self._legs.send_now(prefill, send)
        prefill_task = asyncio.create_task(self._prefill_leg(ex, prefill, send, keep, conn))
        if ex.ticket is not None:
            prefill_task.add_done_callback(lambda task: self._prefill_ended(ex, task))
        ex.sent_at = time.monotonic()
        return Pair(prefill_task, Leg(), prefill.url)

    async def _prefill_leg(
        self, ex: Exchange, worker: Worker, send: Send, keep: bool, conn: Connection | None
    ) -> bytes:
        leg = Leg()
        self._queue.claim(ex, False)  # its slot is taken for real now (worker.inflight)
        # This attempt's choice: a retry replaces ex.kv while this leg may still be finishing.
        choice = ex.kv if ex.kv is not None and ex.kv.worker is worker else None
        status = 0
        try:
            status, content_type, data = await self._legs.read_leg(
                "prefill", worker, send, self._legs.prefill_timeout, leg=leg, conn=conn
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

    # -- the decode leg, not streamed --------------------------------------------------------

    async def _unary(
        self, ex: Exchange, prefill: Worker, decode: Worker, send: Send
    ) -> web.StreamResponse:
        pd = ex.pd
        keep = pd.merge is not Merge.NONE
        pair = self.start(ex, prefill, send, keep)
        finished = False
        try:
            leg = pair.decode
            try:
                status, content_type, data = await self._legs.read_leg(
                    "decode", decode, send, self._legs.request_timeout, leg=leg
                )
            except LegError as error:
                raise self._legs.decode_failed(pair, decode, error) from None
            finally:
                ex.decode_s = time.monotonic() - leg.started
            if status >= 500:
                raise self._legs.decode_status(pair, decode, status, content_type, data)
            if status >= 300:
                pair.cancel()
                ex.causes.append("decode_status")
            elif keep:
                prefill_data = await pair.prefill_task
                data = merge_body(pd.merge, prefill_data, data)
            finished = True
            if status < 300 and decode.failures:
                self._pool.record_served(decode)
            self._legs.finish_in_background(pair)
            return web.Response(
                body=data,
                status=status,
                headers=self._response_headers(ex, content_type or "application/json"),
            )
        finally:
            if not finished:
                pair.cancel()

    # -- the decode leg, streamed, and the relay ---------------------------------------------

    async def _stream(
        self, ex: Exchange, prefill: Worker, decode: Worker, send: Send
    ) -> web.StreamResponse:
        pd = ex.pd
        keep = pd.merge is not Merge.NONE
        pair = self.start(ex, prefill, send, keep)
        guard = self._legs.watch_stream(pair, decode)
        finished = False
        upstream: Connection | None = None
        try:
            try:
                upstream = await self._legs.open("decode", decode, send, pair.decode)
            except LegError as error:
                raise self._legs.decode_failed(pair, decode, error) from None
            if upstream.status >= 300:
                data = await self._legs.read_error(pair, decode, upstream)
                if upstream.status >= 500:
                    raise self._legs.decode_status(
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
                raise self._legs.stream_failure(pair, decode, exc) from None
            failed = first_event_error(first)
            if failed is not None and failed >= 500:  # a 4xx event is the worker's verdict
                with contextlib.suppress(UpstreamError, TimeoutError, LegError):
                    first += await upstream.read()
                raise self._legs.decode_status(pair, decode, failed, "application/json", first)
            guard.idle = self._legs.stall_timeout
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
                cut = self._legs.stream_failure(pair, decode, exc)
                pair.cancel()  # a stalled leg is cancelled before the stream moves on
                if isinstance(cut, LegError):
                    self.blame(decode, cut)
                try:
                    failure = await self._migration.migrate(ex, relay, cut)
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
            self._legs.finish_in_background(pair)
            return out
        finally:
            self._legs.watchdog.release(guard)
            decode.inflight -= 1
            ex.decode_s = time.monotonic() - pair.decode.started
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

    def _response_headers(self, ex: Exchange, content_type: str) -> dict[str, str]:
        return {"Content-Type": content_type, **path_headers(ex)}
