"""Dual dispatch: one PD request to a prefill and a decode, concurrently, and the answer back.

For each attempt: choose a prefill and a decode, encode the body once with fresh bootstrap
fields, send it to both on the same path, and answer with the decode's response. The legs are
two tasks bound by a `_Pair`: a prefill that fails cancels the decode (which would otherwise
wait for KV that never comes); a decode that fails cancels the prefill; a client that goes away
cancels the handler and with it both legs (closing an upstream connection makes SGLang abort
the request).

Only a leg whose connection could not be made (nothing sent) is retried, on other workers, with
new rooms, up to `retries` times, and only before anything reached the client. For streams the
response is committed at the decode's first bytes, which come after the prefill is done, so a
failing prefill still gets a clean HTTP error instead of a broken stream.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from kit.lb.config import LbConfig, Role
from kit.lb.errors import ApiError, LegError
from kit.lb.logprobs import StreamMerger, merge_body
from kit.lb.metrics import LbMetrics
from kit.lb.policies import Policy
from kit.lb.protocol import Merge, PdRequest, affinity_key
from kit.lb.recent import PathRecord, RecentRequests
from kit.lb.stream import ClientGone, StreamRelay
from kit.lb.watchdog import Guard, Watchdog
from kit.lb.workers import Worker, WorkerPool

log = logging.getLogger("kit.lb.dispatch")


@dataclass(slots=True)
class Exchange:
    """One client request in flight: what the server needs to finish and count it."""

    request: web.BaseRequest
    pd: PdRequest
    started: float
    request_id: str = ""
    path: PathRecord | None = None  # the prefill, decode and room chosen (last attempt)
    out: web.StreamResponse | None = None
    relay: StreamRelay | None = None
    # Metrics labels of what went wrong on the way (retries, a lost client...), counted once.
    causes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Send:
    """What both legs of one attempt send: path, encoded body, headers."""

    path: str
    body: bytes
    headers: dict[str, str]


class _Pair:
    """The two legs of one attempt; a failed prefill cancels the decode (or closes its stream)."""

    __slots__ = (
        "decode_response",
        "decode_task",
        "guard",
        "prefill_error",
        "prefill_task",
        "reported",
    )

    def __init__(self, prefill_task: asyncio.Task[bytes], decode_task: asyncio.Task[Any]) -> None:
        self.prefill_task = prefill_task
        self.decode_task = decode_task
        self.prefill_error: LegError | None = None
        self.reported = False  # the prefill's error reached the client (or was raised)
        self.guard: Guard | None = None  # streams: the watchdog's view of this attempt
        self.decode_response: aiohttp.ClientResponse | None = None
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
        if not self.decode_task.done():
            self.decode_task.cancel()
        elif self.decode_response is not None:
            self.decode_response.close()

    def expire(self) -> None:
        """The watchdog's verdict: stop waiting for the decode (its read then fails)."""
        if not self.decode_task.done():
            self.decode_task.cancel()
        elif self.decode_response is not None:
            self.decode_response.close()

    def take_error(self) -> LegError:
        """The prefill's error, now reported to the client (not to be counted again)."""
        if self.prefill_error is None:
            raise RuntimeError("no prefill error to report")
        self.reported = True
        return self.prefill_error

    def cancel(self) -> None:
        for task in (self.prefill_task, self.decode_task):
            if not task.done():
                task.cancel()
        if self.decode_response is not None:
            self.decode_response.close()


def _leg_error(role: Role, worker: Worker, exc: BaseException) -> LegError:
    """Map a client exception of one leg to the error the client sees."""
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
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
        f"{role} worker {worker.url} failed: {type(exc).__name__}: {exc}",
        f"{role}_transport",
        role=role,
        worker=worker.url,
    )


class Dispatcher:
    """Sends PD requests; one per load balancer, sharing its session, pool and policies."""

    def __init__(
        self,
        config: LbConfig,
        *,
        pool: WorkerPool,
        policies: dict[Role, Policy],
        session: aiohttp.ClientSession,
        metrics: LbMetrics,
        rng: random.Random,
        worker_headers: dict[str, str],
        on_connection_error: Callable[[Worker, str], None],
        on_failure: Callable[[ApiError], None],
        recent: RecentRequests,
    ) -> None:
        self._config = config
        self._pool = pool
        self._policies = policies
        self._session = session
        self._metrics = metrics
        self._rng = rng
        self._on_connection_error = on_connection_error
        self._on_failure = on_failure  # logs worker trouble the client cannot be told about
        self._recent = recent
        self._background: set[asyncio.Task[bytes]] = set()
        connect = config.connect_timeout
        self._prefill_timeout = aiohttp.ClientTimeout(
            total=config.prefill_timeout or None, sock_connect=connect
        )
        self._unary_timeout = aiohttp.ClientTimeout(
            total=config.request_timeout or None, sock_connect=connect
        )
        # No sock_read: stream limits are the watchdog's (no timer churn per token).
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect)
        self._watchdog = Watchdog(config.idle_timeout or None, config.request_timeout or None)
        self._base_headers = {"Content-Type": "application/json", **worker_headers}

    async def close(self) -> None:
        """Stop the stream watchdog; cancel prefill legs still finishing in the background."""
        await self._watchdog.close()
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- selection ---------------------------------------------------------------------------

    def _pick(self, role: Role, key: bytes | None, exclude: set[str]) -> Worker:
        workers = self._pool.routable(role)
        if exclude:
            workers = [w for w in workers if w.url not in exclude]
        if not workers:
            raise self._no_worker(role, exclude)
        return self._policies[role].choose(workers, key)

    def _no_worker(self, role: Role, exclude: set[str]) -> ApiError:
        all_workers = self._pool.role(role)
        if not all_workers:
            return ApiError(503, f"no {role} worker is configured", f"no_{role}")
        why = "; ".join(
            f"{w.url} failed in this request"
            if w.url in exclude
            else f"{w.url} {w.state.value} ({w.reason})"
            for w in all_workers
        )
        return ApiError(503, f"no healthy {role} worker available: {why}", f"no_{role}")

    # -- entry point -------------------------------------------------------------------------

    async def dispatch(self, ex: Exchange) -> web.StreamResponse:
        """Answer one PD request (retrying unreachable workers); raises ApiError before commit."""
        pd = ex.pd
        needs_key = self._policies["prefill"].needs_key or self._policies["decode"].needs_key
        key = affinity_key(pd, self._config.prefix_chars) if needs_key else None
        ex.request_id = (
            ex.request.headers.get("X-Request-Id") or f"{self._rng.getrandbits(64):016x}"
        )
        headers = {**self._base_headers, "X-Request-Id": ex.request_id}
        excluded: set[str] = set()
        attempt = 0
        while True:
            prefill = self._pick("prefill", key, excluded)
            decode = self._pick("decode", key, excluded)
            body, room = pd.encode(prefill.bootstrap_host, prefill.bootstrap_port, self._rng)
            ex.path = PathRecord(ex.request_id, pd.path, prefill.url, decode.url, room, ex.started)
            self._recent.chose(ex.path)
            send = _Send(pd.path, body, headers)
            try:
                if pd.stream:
                    return await self._stream(ex, prefill, decode, send)
                return await self._unary(ex, prefill, decode, send)
            except LegError as error:
                if not error.unsent:
                    raise
                role: Role = "prefill" if error.role == "prefill" else "decode"
                worker = prefill if role == "prefill" else decode
                self._on_connection_error(worker, str(error))
                excluded.add(worker.url)
                others = [w for w in self._pool.routable(role) if w.url not in excluded]
                if attempt >= self._config.retries or not others:
                    raise
                ex.causes.append(error.cause)
                attempt += 1
                self._metrics.retry(role)
                log.info("retrying on another %s worker: %s", role, error.message)

    # -- legs --------------------------------------------------------------------------------

    async def _post(
        self, role: Role, worker: Worker, send: _Send, timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        worker.requests += 1
        try:
            resp = await self._session.post(
                worker.endpoint(send.path), data=send.body, headers=send.headers, timeout=timeout
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _leg_error(role, worker, exc) from exc
        if worker.connection_errors:
            self._pool.record_success(worker)
        return resp

    async def _read_leg(
        self, role: Role, worker: Worker, send: _Send, timeout: aiohttp.ClientTimeout
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """One whole non-streamed leg: the response (released) and its body."""
        worker.inflight += 1
        try:
            resp = await self._post(role, worker, send, timeout)
            try:
                return resp, await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _leg_error(role, worker, exc) from exc
            finally:
                resp.release()
        finally:
            worker.inflight -= 1

    async def _prefill_leg(self, worker: Worker, send: _Send, keep: bool) -> bytes:
        resp, data = await self._read_leg("prefill", worker, send, self._prefill_timeout)
        if resp.status >= 300:
            snippet = data[:300].decode("utf-8", "replace")
            raise LegError(
                resp.status,
                f"prefill worker {worker.url} answered {resp.status}: {snippet}",
                "prefill_status",
                role="prefill",
                worker=worker.url,
                raw_body=data,
                raw_content_type=resp.content_type,
            )
        return data if keep else b""

    async def _decode_unary(self, worker: Worker, send: _Send) -> tuple[int, bytes, str]:
        resp, data = await self._read_leg("decode", worker, send, self._unary_timeout)
        return resp.status, data, resp.headers.get("Content-Type", "application/json")

    async def _decode_open(self, worker: Worker, send: _Send) -> aiohttp.ClientResponse:
        return await self._post("decode", worker, send, self._stream_timeout)

    def _start(
        self, prefill: Worker, send: _Send, keep: bool, decode_coro: Coroutine[Any, Any, Any]
    ) -> _Pair:
        prefill_task = asyncio.create_task(self._prefill_leg(prefill, send, keep))
        return _Pair(prefill_task, asyncio.create_task(decode_coro))

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

    async def _await_decode(self, pair: _Pair, decode: Worker) -> Any:
        """The decode task's result; a prefill failure that cancelled it is raised instead."""
        try:
            return await pair.decode_task
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the client went away (or the drain ended): not the legs' doing
            if pair.prefill_error is not None:
                raise pair.take_error() from None
            if pair.guard is not None and pair.guard.expired:
                raise self._expired(pair.guard, decode) from None
            raise

    # -- non-streaming -----------------------------------------------------------------------

    async def _unary(
        self, ex: Exchange, prefill: Worker, decode: Worker, send: _Send
    ) -> web.StreamResponse:
        pd = ex.pd
        keep = pd.merge is not Merge.NONE
        pair = self._start(prefill, send, keep, self._decode_unary(decode, send))
        finished = False
        try:
            status, data, content_type = await self._await_decode(pair, decode)
            if status >= 300:
                pair.cancel()
                ex.causes.append("decode_status")
            elif keep:
                prefill_data = await pair.prefill_task
                data = merge_body(pd.merge, prefill_data, data)
            finished = True
            self._finish_in_background(pair)
            return web.Response(
                body=data, status=status, headers=self._response_headers(ex, content_type)
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
        pair = self._start(prefill, send, keep, self._decode_open(decode, send))
        guard = pair.guard = self._watchdog.watch(pair.expire)
        decode.inflight += 1
        finished = False
        try:
            upstream = await self._await_decode(pair, decode)
            if not isinstance(upstream, aiohttp.ClientResponse):
                raise TypeError("decode leg returned no response")
            pair.decode_response = upstream
            if pair.prefill_error is not None:
                raise pair.take_error()
            if upstream.status >= 300:
                data = await self._read_error(pair, decode, upstream)
                pair.cancel()
                ex.causes.append("decode_status")
                finished = True
                return web.Response(
                    body=data,
                    status=upstream.status,
                    headers=self._response_headers(
                        ex, upstream.headers.get("Content-Type", "application/json")
                    ),
                )
            merger = None
            if keep:
                merger = StreamMerger(pd.merge, await pair.prefill_task)
            try:
                first = await upstream.content.readany()
            except aiohttp.ClientError as exc:
                raise self._stream_failure(pair, decode, exc) from None
            out = web.StreamResponse(
                status=upstream.status,
                headers=self._response_headers(
                    ex, upstream.headers.get("Content-Type", "text/event-stream")
                ),
            )
            out.headers["Cache-Control"] = "no-cache"
            out.headers["X-Accel-Buffering"] = "no"
            await out.prepare(ex.request)
            ex.out = out
            ttft, itl = self._metrics.stream_timers(pd.path)
            relay = StreamRelay(out, ex.started, ttft, itl, merger)
            ex.relay = relay
            try:
                await relay.run(upstream, first, guard)
            except ClientGone:
                ex.causes.append("client_disconnect")
                return out
            except aiohttp.ClientError as exc:
                error = self._stream_failure(pair, decode, exc)
                ex.causes.append(error.cause)
                self._on_failure(error)
                try:
                    await relay.fail(error)
                except ClientGone:
                    ex.causes.append("client_disconnect")
            finished = True
            self._finish_in_background(pair)
            return out
        finally:
            self._watchdog.release(guard)
            decode.inflight -= 1
            if not finished:
                pair.cancel()
            elif pair.decode_response is not None:
                pair.decode_response.release()

    def _expired(self, guard: Guard, decode: Worker) -> ApiError:
        """The error for a stream the watchdog stopped."""
        if guard.expired == "total":
            limit = self._config.request_timeout
            return ApiError(
                504, f"the request took longer than --request-timeout {limit:g} s", "timeout"
            )
        return LegError(
            504,
            f"decode worker {decode.url} sent nothing for {self._config.idle_timeout:g} s "
            "(--idle-timeout)",
            "decode_timeout",
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

    async def _read_error(
        self, pair: _Pair, decode: Worker, upstream: aiohttp.ClientResponse
    ) -> bytes:
        try:
            return await upstream.read()
        except aiohttp.ClientError as exc:
            raise self._stream_failure(pair, decode, exc) from exc

    def _response_headers(self, ex: Exchange, content_type: str) -> dict[str, str]:
        return {"Content-Type": content_type, **path_headers(ex)}


def path_headers(ex: Exchange) -> dict[str, str]:
    """The request id and the PD path chosen for it, for the client (`pdkit bench` records
    them; `GET /requests?id=` answers the same after the fact)."""
    headers = {"X-Request-Id": ex.request_id} if ex.request_id else {}
    if ex.path is not None:
        headers["X-PDKit-Prefill"] = ex.path.prefill
        headers["X-PDKit-Decode"] = ex.path.decode
        headers["X-PDKit-Bootstrap-Room"] = str(ex.path.bootstrap_room)
    return headers
