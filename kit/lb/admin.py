"""`/workers`: list, add and remove (with drain) workers at run time, behind the admin key.

GET    /workers                       {"workers": [...]} with state, reason, in-flight
POST   /workers  {"url", "role", "bootstrap_port"?}   201, the new worker (pending until
                                      its first good health probe); a returning one's URL is
                                      added again (its new process)
DELETE /workers?url=URL[&wait=true][&grace=S][&back_within=B]
                                      202 draining (200 once removed when wait=true): no new
                                      requests; removed when its in-flight requests finish
                                      or after `grace` s (default: the lb's --drain-grace).
                                      With `back_within`, an operator replaces its process:
                                      it stays listed as returning (requests for its role are
                                      held, not refused) until added again, or removed after
                                      B s
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from kit.lb.config import WorkerSpec, normalize_url
from kit.lb.errors import ApiError, LbConfigError
from kit.lb.workers import State, Worker, WorkerPool

log = logging.getLogger("kit.lb.admin")

# How often a draining worker's in-flight count is checked (s).
DRAIN_POLL = 0.05

# The longest drain one DELETE may ask for (s): a day.
MAX_GRACE = 86400.0


def _worker_url(raw: str) -> str:
    """A worker URL from a request, normalized as on the command line; 400 when unusable."""
    try:
        return normalize_url(raw)
    except LbConfigError as exc:
        raise ApiError(400, str(exc), "bad_request", param="url") from None


def _seconds(raw: str | None, default: float, param: str, what: str) -> float:
    """Seconds from one DELETE's query (`?grace=`, `?back_within=`), 0 to a day; `default`
    when not given; 400 otherwise."""
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_GRACE:
        raise ApiError(
            400,
            f"'{param}' is {what}, 0 to {MAX_GRACE:g} (got {raw!r})",
            "bad_request",
            param=param,
        )
    return seconds


class AdminRoutes:
    """The /workers handlers; `on_added`/`on_removed` start and stop health probing."""

    def __init__(
        self,
        pool: WorkerPool,
        drain_grace: float,
        on_added: Callable[[Worker], None],
        on_removed: Callable[[Worker], Awaitable[None]],
    ) -> None:
        self._pool = pool
        self._drain_grace = drain_grace
        self._on_added = on_added
        self._on_removed = on_removed
        self._drains: dict[str, asyncio.Task[int]] = {}
        self._returns: dict[str, asyncio.Task[None]] = {}

    async def close(self) -> None:
        for task in [*self._drains.values(), *self._returns.values()]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def list_workers(self, request: web.BaseRequest) -> web.Response:
        now = time.monotonic()
        return web.json_response({"workers": [w.describe(now) for w in self._pool]})

    async def add(self, request: web.BaseRequest) -> web.Response:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            raise ApiError(
                400, 'send a JSON object: {"url": ..., "role": ...}', "bad_request"
            ) from None
        if not isinstance(body, dict):
            raise ApiError(400, 'send a JSON object: {"url": ..., "role": ...}', "bad_request")
        role = body.get("role")
        if role not in ("prefill", "decode"):
            raise ApiError(400, "'role' must be prefill or decode", "bad_request", param="role")
        raw = body.get("url")
        if not isinstance(raw, str):
            raise ApiError(
                400, "'url' must be a string like http://HOST:PORT", "bad_request", param="url"
            )
        url = _worker_url(raw)
        port = body.get("bootstrap_port")
        if port is not None and (
            role == "decode"
            or isinstance(port, bool)
            or not isinstance(port, int)
            or not 1 <= port <= 65535
        ):
            raise ApiError(
                400,
                "'bootstrap_port' is a port number, for prefill workers only",
                "bad_request",
                param="bootstrap_port",
            )
        known = self._pool.get(url)
        if known is not None and known.state is State.RETURNING:
            self._stop_return(url)  # its new process: added afresh, pending its probe
            self._pool.remove(url)
        elif known is not None:
            raise ApiError(409, f"worker {url} is already registered; remove it first", "conflict")
        worker = self._pool.add(WorkerSpec(url, role, port), time.monotonic())
        self._on_added(worker)
        log.info("added %s worker %s (pending its first health probe)", role, url)
        return web.json_response({"worker": worker.describe(time.monotonic())}, status=201)

    async def remove(self, request: web.BaseRequest) -> web.Response:
        raw = request.query.get("url")
        if not raw:
            raise ApiError(
                400, "give the worker as ?url=http://HOST:PORT", "bad_request", param="url"
            )
        url = _worker_url(raw)
        worker = self._pool.get(url)
        if worker is None:
            raise ApiError(404, f"no worker {url} is registered", "not_found")
        grace = _seconds(
            request.query.get("grace"),
            self._drain_grace,
            "grace",
            "the seconds to let in-flight requests finish",
        )
        back = _seconds(
            request.query.get("back_within"),
            0.0,
            "back_within",
            "the seconds within which the worker is added again (0: removed for good)",
        )
        self._stop_return(url)
        if worker.state is not State.DRAINING:
            self._pool.drain(worker, time.monotonic())
            log.info(
                "draining %s worker %s (%d in flight, grace %g s)",
                worker.role,
                url,
                worker.inflight,
                grace,
            )
            self._drains[url] = asyncio.create_task(self._drain(worker, grace, back))
        wait = request.query.get("wait", "").lower() in ("1", "true", "yes")
        if not wait:
            return web.json_response({"worker": worker.describe(time.monotonic())}, status=202)
        task = self._drains.get(url)
        left = await asyncio.shield(task) if task is not None else worker.inflight
        answer: dict[str, object] = {"removed": worker.url, "drained": left == 0}
        answer["inflight_left"] = left
        if worker.state is State.RETURNING:
            answer["back_within"] = back
        return web.json_response(answer)

    async def _drain(self, worker: Worker, grace: float, back: float) -> int:
        """Wait up to `grace` s for the worker's in-flight requests, then remove it, or with
        `back` > 0 mark it returning for `back` s; the number still in flight at that moment
        (those are cut off)."""
        deadline = time.monotonic() + grace
        try:
            while worker.inflight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(DRAIN_POLL)
            left = worker.inflight
            if back > 0:
                self._pool.returning(worker, back, time.monotonic())
                self._returns[worker.url] = asyncio.create_task(self._expire(worker, back))
            else:
                self._pool.remove(worker.url)
            await self._on_removed(worker)
            log.info(
                "removed %s worker %s%s%s",
                worker.role,
                worker.url,
                f" with {left} requests still in flight" if left else "",
                f"; returning within {back:g} s (its role's requests are held)" if back else "",
            )
            return left
        finally:
            self._drains.pop(worker.url, None)

    async def _expire(self, worker: Worker, back: float) -> None:
        """A returning worker not added again within `back` s is removed."""
        await asyncio.sleep(back)
        self._returns.pop(worker.url, None)
        if self._pool.get(worker.url) is worker and worker.state is State.RETURNING:
            self._pool.remove(worker.url)
            log.warning(
                "%s worker %s was not added again within %g s: removed",
                worker.role,
                worker.url,
                back,
            )

    def _stop_return(self, url: str) -> None:
        task = self._returns.pop(url, None)
        if task is not None:
            task.cancel()
