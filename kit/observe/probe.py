"""Ask every worker and the router for their state: concurrent, bounded, each request timed out.

One `Prober` holds one aiohttp session (pooled connections, kept across `--watch` rounds) and a
semaphore that bounds the requests in flight. Each request has its own timeout, and the waiting
for a permit does not count against it, so a round over hundreds of workers takes about one
timeout when they are slow, not their sum.

Nothing here judges an answer: `Fetched` records what came back (status, body) or why nothing
did (refused, timeout, ...); `kit.observe.worker` and `kit.observe.router` evaluate it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace, TracebackType
from typing import Any

import aiohttp

from kit.errors import ProbeError
from kit.net import FailureKind, classify_failure
from kit.observe.targets import KvPoolTarget, RouterTarget, Targets, WorkerTarget

WORKER_PATHS = ("/server_info", "/v1/loads?include=all", "/metrics")
"""What a worker is asked besides /health."""
MAX_BODY = 8 * 1024 * 1024  # a /metrics page of a large worker is well below this

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_CONCURRENCY = 128


@dataclass(frozen=True)
class Fetched:
    """One GET: the HTTP status and body, or the failure. `seconds` is how long it took and
    `at` the time.monotonic() when it ended (rates divide by the gap between two `at`)."""

    url: str
    status: int | None = None
    body: str = ""
    failure: FailureKind | None = None
    detail: str = ""
    seconds: float = 0.0
    at: float = 0.0

    @property
    def answered(self) -> bool:
        return self.status is not None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def why(self) -> str:
        """Why this answer is not usable, for a note: the HTTP status, or the failure."""
        if self.status is not None:
            return f"HTTP {self.status}" if not self.ok else "unreadable JSON"
        return self.detail or "no answer"

    def json(self, any_status: bool = False) -> Any:
        """The body as JSON when the status is 200 (or any, with `any_status`), else None."""
        if not (self.ok or (any_status and self.answered)):
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True)
class WorkerAnswers:
    """What one worker said to one probe round."""

    target: WorkerTarget
    health: Fetched
    server_info: Fetched
    loads: Fetched
    metrics: Fetched


@dataclass(frozen=True)
class RouterAnswers:
    """What the router said: liveness, readiness, its worker list and its metrics."""

    target: RouterTarget
    health: Fetched
    readiness: Fetched
    workers: Fetched
    metrics: Fetched


@dataclass(frozen=True)
class KvPoolAnswers:
    """What the KV pool's master said: its /health and /metrics."""

    target: KvPoolTarget
    health: Fetched
    metrics: Fetched


@dataclass(frozen=True)
class ReplicaAnswers:
    """What one router replica (router.hosts) said: /health and /readiness."""

    host: str
    url: str
    health: Fetched
    readiness: Fetched


@dataclass(frozen=True)
class Round:
    """One probe round. `taken_at` is wall-clock (time.time()) when it started, `seconds` how
    long asking everything took; `router_metrics_before` is an earlier scrape of the router's
    metrics when the round took two to compute rates (the wait between them is not counted)."""

    workers: tuple[WorkerAnswers, ...]
    router: RouterAnswers
    taken_at: float
    seconds: float
    router_metrics_before: Fetched | None = None
    kv_pool: KvPoolAnswers | None = None
    replicas: tuple[ReplicaAnswers, ...] = ()
    vip: Fetched | None = None


async def _mark_sent(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
    ctx.trace_request_ctx.sent = True


class Prober:
    """Concurrent GETs over one session. Use as `async with Prober(...) as prober:`.

    `timeout` is seconds per request (connect + answer); `concurrency` bounds the requests
    in flight across all targets.
    """

    def __init__(
        self, timeout: float = DEFAULT_TIMEOUT_S, concurrency: int = DEFAULT_CONCURRENCY
    ) -> None:
        if timeout <= 0:
            raise ProbeError(f"probe timeout must be > 0 s, got {timeout:g}")
        if concurrency < 1:
            raise ProbeError(f"probe concurrency must be >= 1, got {concurrency}")
        self.timeout = timeout
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None
        self._permits: asyncio.Semaphore | None = None

    async def __aenter__(self) -> Prober:
        trace = aiohttp.TraceConfig(trace_config_ctx_factory=SimpleNamespace)
        trace.on_request_headers_sent.append(_mark_sent)
        connector = aiohttp.TCPConnector(
            limit=self.concurrency, limit_per_host=0, ttl_dns_cache=300, use_dns_cache=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            trace_configs=[trace],
            headers={"User-Agent": "pdkit-observe"},
            auto_decompress=True,
        )
        self._permits = asyncio.Semaphore(self.concurrency)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(
        self, url: str, headers: dict[str, str] | None = None, timeout: float | None = None
    ) -> Fetched:
        """GET `url` within `timeout` seconds (default: the prober's); never raises for
        network trouble (it is recorded in the result)."""
        return await self._request("GET", url, None, headers, timeout or self.timeout)

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Fetched:
        """POST the JSON `body` to `url` within `timeout` seconds (default: the prober's);
        never raises for network trouble. A cancelled call closes its connection, which makes
        an SGLang server abort the request."""
        sent = {"Content-Type": "application/json", **(headers or {})}
        return await self._request("POST", url, body, sent, timeout or self.timeout)

    async def _request(
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str] | None,
        timeout: float,
    ) -> Fetched:
        if self._session is None or self._permits is None:
            raise ProbeError("Prober used outside `async with`")
        async with self._permits:
            state = SimpleNamespace(sent=False)
            started = time.monotonic()
            try:
                async with asyncio.timeout(timeout):
                    async with self._session.request(
                        method,
                        url,
                        data=data,
                        headers=headers,
                        allow_redirects=False,
                        trace_request_ctx=state,
                    ) as response:
                        raw = await response.content.read(MAX_BODY)
                        body = raw.decode("utf-8", errors="replace")
                        ended = time.monotonic()
                        return Fetched(
                            url, response.status, body, seconds=ended - started, at=ended
                        )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                kind, detail = classify_failure(exc, bool(state.sent), timeout)
                ended = time.monotonic()
                return Fetched(url, failure=kind, detail=detail, seconds=ended - started, at=ended)

    async def workers(self, targets: Sequence[WorkerTarget]) -> list[WorkerAnswers]:
        """Every worker's four endpoints: /health first, then the other three concurrently.

        All /health requests queue for a permit before any other request. The load figures
        are read once /health has answered: SGLang's /health runs a one-token generation, and
        a /v1/loads or /metrics read while it runs counts it ("running 1" on an idle worker).
        A worker whose /health gets no HTTP answer is not asked the rest (`skipped`): a silent
        worker then costs one timeout counted from early in the round, not from its end.
        """
        health = [asyncio.ensure_future(self.get(f"{t.url}/health")) for t in targets]

        async def settle(target: WorkerTarget, first: asyncio.Future[Fetched]) -> WorkerAnswers:
            answer = await first
            if answer.failure is not None:
                skipped = [
                    Fetched(
                        f"{target.url}{path}",
                        failure="skipped",
                        detail=f"not asked: /health {answer.detail}",
                        at=answer.at,
                    )
                    for path in WORKER_PATHS
                ]
                return WorkerAnswers(target, answer, *skipped)
            if target.follower:
                # Node ranks >= 1 serve /health and /metrics only.
                metrics = await self.get(f"{target.url}/metrics")
                info, loads = (
                    Fetched(
                        f"{target.url}{path}",
                        failure="skipped",
                        detail=f"not asked: node rank {target.node_rank} serves no {path}",
                        at=answer.at,
                    )
                    for path in WORKER_PATHS[:2]
                )
                return WorkerAnswers(target, answer, info, loads, metrics)
            fetched = await asyncio.gather(
                *(self.get(f"{target.url}{path}") for path in WORKER_PATHS)
            )
            return WorkerAnswers(target, answer, *fetched)

        return list(
            await asyncio.gather(*(settle(t, h) for t, h in zip(targets, health, strict=True)))
        )

    async def router(self, target: RouterTarget) -> RouterAnswers:
        """Liveness, readiness, the worker list and the metrics of the router, concurrently."""
        headers = auth_headers(target)
        health, readiness, workers, metrics = await asyncio.gather(
            self.get(f"{target.url}/health", headers),
            self.get(f"{target.url}/readiness", headers),
            self.get(f"{target.url}/workers", headers),
            self.get(target.metrics_url, headers),
        )
        return RouterAnswers(target, health, readiness, workers, metrics)

    async def round(self, targets: Targets, rate_window_s: float = 0.0) -> Round:
        """Probe everything once.

        With `rate_window_s` > 0 the router's metrics are scraped a second time, at least that
        many seconds after the first, so that one round can report request rates.
        """
        taken_at, started = time.time(), time.monotonic()
        router_task = asyncio.ensure_future(self.router(targets.router))  # first in the queue
        pool_task = asyncio.ensure_future(self.kv_pool(targets.kv_pool))
        replicas_task = asyncio.ensure_future(self.replicas(targets))
        workers = await self.workers(targets.workers)
        router = await router_task
        kv_pool = await pool_task
        replicas, vip = await replicas_task
        seconds = time.monotonic() - started
        before: Fetched | None = None
        if rate_window_s > 0 and router.metrics.ok:
            wait = rate_window_s - (time.monotonic() - router.metrics.at)
            if wait > 0:
                await asyncio.sleep(wait)
            second = await self.get(targets.router.metrics_url, auth_headers(targets.router))
            if second.ok:
                before = router.metrics
                router = RouterAnswers(
                    router.target, router.health, router.readiness, router.workers, second
                )
        return Round(
            workers=tuple(workers),
            router=router,
            taken_at=taken_at,
            seconds=seconds,
            router_metrics_before=before,
            kv_pool=kv_pool,
            replicas=replicas,
            vip=vip,
        )

    async def replicas(self, targets: Targets) -> tuple[tuple[ReplicaAnswers, ...], Fetched | None]:
        """Every router replica's /health and /readiness (router.hosts), and the VIP's /health
        (router.vip), concurrently; `kit.observe.replicas` judges them."""
        headers = auth_headers(targets.router)

        async def one(host: str, url: str) -> ReplicaAnswers:
            health, readiness = await asyncio.gather(
                self.get(f"{url}/health", headers), self.get(f"{url}/readiness", headers)
            )
            return ReplicaAnswers(host, url, health, readiness)

        async def vip() -> Fetched | None:
            return await self.get(f"{targets.vip_url}/health", headers) if targets.vip_url else None

        answers, at_vip = await asyncio.gather(
            asyncio.gather(*(one(r.host, r.url) for r in targets.replicas)), vip()
        )
        return tuple(answers), at_vip

    async def kv_pool(self, target: KvPoolTarget | None) -> KvPoolAnswers | None:
        """The KV pool master's /health and /metrics (None without `kv_pool:`)."""
        if target is None:
            return None
        health, metrics = await asyncio.gather(
            self.get(f"{target.url}/health"), self.get(f"{target.url}/metrics")
        )
        return KvPoolAnswers(target, health, metrics)


def auth_headers(target: RouterTarget) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else None
