"""The load balancer as an aiohttp server: routes, keys, errors, and its shared state.

One `LoadBalancer` owns everything a running instance needs (pool, policies, pooled client
session, metrics, health monitor); nothing lives in module globals, so tests can run several.
Lifecycle: `await lb.start()`, serve `lb.make_server()` (e.g. with `web.ServerRunner`), then
`await lb.close()`.
Every handler is wrapped so that a failure becomes an OpenAI-style JSON error, never a
traceback: `ApiError` with its own status, anything unexpected as 500 (logged here).

Routes:
    POST /generate  /v1/completions  /v1/chat/completions     PD dispatch        (API key)
    GET  /v1/models  /model_info  /server_info                 from the workers   (API key)
    GET  /health  /liveness                                    liveness           (open)
    GET  /readiness                                            >= 1 healthy P and D (open)
    GET  /metrics                                              Prometheus         (open)
    GET|POST|DELETE /workers,  POST /flush_cache               admin              (admin key)
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from kit.lb.access import AccessLog
from kit.lb.admin import AdminRoutes
from kit.lb.admission import Admission, AdmissionConfig, prompt_size
from kit.lb.cache_aware import CacheAware, prompt_ids
from kit.lb.canary import Canary
from kit.lb.config import LbConfig, Role, prompt_vocab
from kit.lb.dispatch import Dispatcher
from kit.lb.errors import ApiError, error_body
from kit.lb.exchange import Exchange, path_headers
from kit.lb.health import HealthMonitor
from kit.lb.info import InfoRoutes
from kit.lb.kv_index import KvIndex, KvSubscriber
from kit.lb.limits import ClientLimits, LimitsCollector
from kit.lb.loads import WorkerLoads
from kit.lb.metrics import CONTENT_TYPE, LbMetrics
from kit.lb.openai_stream import IdStream
from kit.lb.poison import PoisonGuard
from kit.lb.policies import Policy, make_policy
from kit.lb.processes import ProcessGroup
from kit.lb.protocol import GENERATE, PD_ROUTES, PdRequest, parse_request
from kit.lb.recent import RecentRequests
from kit.lb.tokenizer import router_prompts
from kit.lb.upstream import Upstream
from kit.lb.validate import check_request
from kit.lb.workers import HealthRules, State, Worker, WorkerPool

log = logging.getLogger("kit.lb")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

# Status recorded for a request whose client went away before the answer (nginx's convention).
CLIENT_CLOSED = 499
# Seconds between two log lines about failures of the same cause.
LOG_EVERY = 1.0


def _error_response(error: ApiError) -> web.Response:
    response = web.Response(body=error.body(), status=error.status, content_type="application/json")
    if error.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if error.headers:
        response.headers.update(error.headers)
    return response


class LoadBalancer:
    """One PD load balancer instance; `make_server()` gives its aiohttp low-level server."""

    def __init__(self, config: LbConfig, processes: ProcessGroup | None = None) -> None:
        self.config = config
        rules = HealthRules(
            interval=config.health_interval,
            busy_grace=config.busy_grace,
            eject_after_failed_probes=config.eject_after_failed_probes,
            readmit_after=config.readmit_after,
            backoff=config.eject_backoff,
            backoff_max=config.eject_backoff_max,
            eject_after_failed_requests=config.eject_after_failed_requests,
        )
        self.pool = WorkerPool(rules, listener=self._on_transition)
        now = time.monotonic()
        for spec in (*config.prefill, *config.decode):
            self.pool.add(spec, now)
        self.metrics = LbMetrics(lambda: self.pool)
        self.admission: Admission | None = None
        if config.admission:
            self.admission = Admission(
                AdmissionConfig(config.slo_ttft, config.slo_tpot, config.admission_margin)
            )
            self.metrics.admission = self.admission
        self.limits = ClientLimits.from_text(
            config.client_limits,
            config.api_key,
            share=1 / config.processes,
            shared=processes.buckets if processes else None,
        )
        if self.limits is not None:
            self.metrics.registry.register(LimitsCollector(self.limits))
        self.access = AccessLog(config.access_log)
        self.poison = self.metrics.poison = PoisonGuard()
        self.rng = random.Random(config.seed)
        self.recent = RecentRequests()
        self.kv_index: KvIndex | None = None
        self.cache_aware: CacheAware | None = None
        prefill_policy: Policy
        prompts = router_prompts(config)
        self.tokenizer = prompts.tokenizer
        self.metrics.prompt_tokenizer = prompts.kind
        self.vocab_size = prompts.vocab_size
        self.context_length = prompts.context_length
        if config.prefill_policy == "cache_aware":
            self.kv_index = KvIndex(
                silence_s=config.kv_silence,
                silence_requests=config.kv_silence_requests,
                pending_s=config.kv_pending_timeout,
            )
            prefill_policy = self.cache_aware = CacheAware(
                self.kv_index,
                self.rng,
                load_factor=config.affinity_load_factor,
                vocab=prompt_vocab(config),
                tokenizer=self.tokenizer,
            )
            self.metrics.cache_aware = self.cache_aware
        else:
            prefill_policy = make_policy(
                config.prefill_policy, self.rng, config.affinity_load_factor
            )
        self.policies: dict[Role, Policy] = {
            "prefill": prefill_policy,
            "decode": make_policy(config.decode_policy, self.rng, config.affinity_load_factor),
        }
        self._kv_subscriber: KvSubscriber | None = None
        self.processes = processes  # several serve the port
        self.draining = False
        self.handing_over = False
        self.started = time.time()
        """When this process image started serving (unix seconds; a handover changes it)."""
        self.inflight = 0
        self._logged: dict[str, tuple[float, int]] = {}
        self._worker_headers: dict[str, str] = {}
        if config.worker_api_key:
            self._worker_headers["Authorization"] = f"Bearer {config.worker_api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._upstream: Upstream | None = None
        self._dispatcher: Dispatcher | None = None
        self._monitor: HealthMonitor | None = None
        self._loads: WorkerLoads | None = None
        self._info: InfoRoutes | None = None
        self._admin: AdminRoutes | None = None
        self.canary: Canary | None = None
        self._routes = self._build_routes()
        self._not_found = self._open("other", self._no_route)
        self._method_not_allowed = self._open("other", self._refuse_method)

    # -- lifecycle ---------------------------------------------------------------------------

    def make_server(self) -> web.Server:
        """aiohttp's low-level server with this instance's router (call inside the loop).

        The low-level server skips aiohttp's Application machinery (URL dispatcher, match info,
        middleware chain): the routes are a fixed table, and that saves a tenth of the CPU time
        of a request.
        """
        return web.Server(
            self.handle,
            request_factory=self._make_request,
            handler_cancellation=True,  # a client that goes away cancels both legs
            access_log=None,  # PD requests have their own access log (kit.lb.access)
        )

    def _make_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        return web.BaseRequest(
            message,
            payload,
            protocol,
            writer,
            task,
            asyncio.get_running_loop(),
            client_max_size=self.config.max_body_bytes,
        )

    def _build_routes(self) -> dict[str, dict[str, Handler]]:
        routes: dict[str, dict[str, Handler]] = {}

        def add(method: str, path: str, handler: Handler) -> None:
            routes.setdefault(path, {})[method] = handler

        for path in PD_ROUTES:
            add("POST", path, self._pd_handler(path))
        add("GET", "/v1/models", self._keyed("/v1/models", lambda q: self._info_routes().models(q)))
        for path in ("/model_info", "/get_model_info"):
            add("GET", path, self._keyed(path, lambda q: self._info_routes().model_info(q)))
        for path in ("/server_info", "/get_server_info"):
            add("GET", path, self._keyed(path, lambda q: self._info_routes().server_info(q)))
        add(
            "POST",
            "/flush_cache",
            self._admin_only("/flush_cache", lambda q: self._info_routes().flush_cache(q)),
        )
        for path in ("/health", "/liveness"):
            add("GET", path, self._open(path, self._health))
        add("GET", "/readiness", self._open("/readiness", self._readiness))
        add("GET", "/requests", self._keyed("/requests", self.recent.answer))
        add("GET", "/metrics", self._open("/metrics", self._metrics))
        add(
            "GET",
            "/workers",
            self._admin_only("/workers", lambda q: self._admin_routes().list_workers(q)),
        )
        add("POST", "/workers", self._admin_only("/workers", lambda q: self._admin_routes().add(q)))
        add(
            "DELETE",
            "/workers",
            self._admin_only("/workers", lambda q: self._admin_routes().remove(q)),
        )
        return routes

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Route one request: a table lookup by path, then by method."""
        methods = self._routes.get(request.path)
        if methods is None:
            return await self._not_found(request)
        handler = methods.get(request.method)
        if handler is None:
            return await self._method_not_allowed(request)
        return await handler(request)

    async def start(self) -> None:
        """Open the upstream connection pool and start probing the workers."""
        cfg = self.config
        connector = aiohttp.TCPConnector(
            limit=cfg.max_connections,
            limit_per_host=0,
            keepalive_timeout=cfg.upstream_keepalive,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Bodies pass through as they come: ask for them uncompressed (no Accept-Encoding).
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            cookie_jar=aiohttp.DummyCookieJar(),  # workers set no cookies; skip the jar work
        )
        self._upstream = Upstream(
            connect_timeout=cfg.connect_timeout,
            keepalive=cfg.upstream_keepalive,
            max_connections=cfg.max_connections,
        )
        if cfg.canary_interval > 0:
            self.canary = Canary(
                self.pool,
                self._session,
                cfg.canary_interval,
                # Its own: drawing from the routing's would change the choices a seed gives.
                random.Random(None if cfg.seed is None else cfg.seed + 1),
                headers=self._worker_headers,
            )
            self.metrics.canary = self.canary
        self._dispatcher = Dispatcher(
            cfg,
            pool=self.pool,
            policies=self.policies,
            upstream=self._upstream,
            metrics=self.metrics,
            rng=self.rng,
            worker_headers=self._worker_headers,
            on_connection_error=self._on_connection_error,
            on_worker_failure=self._on_worker_failure,
            on_failure=self._log_failure,
            recent=self.recent,
            admission=self.admission,
            avoid=self.canary.avoid if self.canary is not None else None,
            poison=self.poison,
            alive=self._alive,
        )
        if self.admission is not None:
            self._loads = WorkerLoads(
                self.pool,
                self.admission,
                self._session,
                interval=cfg.admission_poll,
                timeout=cfg.health_timeout,
                headers=self._worker_headers,
            )
            self._loads.start()
        self._monitor = HealthMonitor(
            self.pool,
            self._session,
            path=cfg.health_path,
            timeout=cfg.health_timeout,
            headers=self._worker_headers,
        )
        self._info = InfoRoutes(self.pool, self._session, cfg.health_timeout, self._worker_headers)
        if self.metrics.prompt_tokenizer == "sim" and self.vocab_size is None:
            self._info.learn_sim_vocab(lambda vocab: setattr(self, "vocab_size", vocab))
        self._admin = AdminRoutes(self.pool, cfg.drain_grace, self._monitor.watch, self._forget)
        if self.kv_index is not None:
            self._kv_subscriber = KvSubscriber(
                self.kv_index,
                self._session,
                timeout=cfg.health_timeout,
                headers=self._worker_headers,
                clock=time.monotonic,
            )
        for worker in self.pool:
            self._monitor.watch(worker)
        if self.canary is not None:
            self.canary.start()

    async def close(self) -> None:
        """Stop probing, cancel background legs, close the upstream pool."""
        if self.canary is not None:
            await self.canary.close()
        if self._kv_subscriber is not None:
            await self._kv_subscriber.close()
        if self._admin is not None:
            await self._admin.close()
        if self._loads is not None:
            await self._loads.close()
        if self._monitor is not None:
            await self._monitor.close()
        if self._dispatcher is not None:
            await self._dispatcher.close()
        if self._upstream is not None:
            await self._upstream.close()
        if self._session is not None:
            await self._session.close()

    def start_drain(self) -> None:
        """SIGTERM: /readiness says 503 and new requests are refused; in-flight ones finish."""
        self.draining = True
        self.metrics.draining = True

    def start_handover(self) -> None:
        """SIGUSR2 (`kit.lb.run`): requests still arriving on open connections are served, each
        connection closed after its response, so that its client reconnects to the socket the
        next process takes over."""
        self.handing_over = True

    async def _forget(self, worker: Worker) -> None:
        if self._monitor is not None:
            await self._monitor.unwatch(worker.url)
        if self._upstream is not None:
            self._upstream.forget(worker.url)
        if self.admission is not None:
            self.admission.forget(worker.url)
        if self._kv_subscriber is not None:
            self._kv_subscriber.unwatch(worker.url)
        if self.kv_index is not None:
            self.kv_index.forget(worker.url)

    def _on_transition(self, worker: Worker, old: State, new: State) -> None:
        subscriber = self._kv_subscriber
        if subscriber is not None and worker.role == "prefill":
            # A worker back from anywhere may be a new process: read its publisher afresh.
            if new is State.HEALTHY:
                subscriber.watch(worker.url, worker.bootstrap_host)
            else:
                subscriber.unwatch(worker.url)
        if new is State.HEALTHY:
            log.info(
                "%s worker %s is healthy%s",
                worker.role,
                worker.url,
                "" if old is State.PENDING else f" again (was {old.value})",
            )
        elif new is State.UNHEALTHY:
            log.warning("%s worker %s is out: %s", worker.role, worker.url, worker.reason)

    async def _alive(self, worker: Worker) -> bool:
        """One health probe of `worker` now: whether it answers (the poison rule's test)."""
        if self._monitor is None:
            return False
        healthy, _, _ = await self._monitor.probe(worker)
        return healthy

    def _on_connection_error(self, worker: Worker, detail: str) -> None:
        backoff = self.pool.record_connection_error(worker, detail, time.monotonic())
        if backoff is not None and self._monitor is not None:
            self._monitor.wake(worker)

    def _on_worker_failure(self, worker: Worker, detail: str) -> None:
        backoff = self.pool.record_failure(worker, detail, time.monotonic())
        if backoff is not None and self._monitor is not None:
            self._monitor.wake(worker)

    def _info_routes(self) -> InfoRoutes:
        if self._info is None:
            raise ApiError(503, "the load balancer is starting", "starting")
        return self._info

    def _admin_routes(self) -> AdminRoutes:
        if self._admin is None:
            raise ApiError(503, "the load balancer is starting", "starting")
        return self._admin

    # -- guards ------------------------------------------------------------------------------

    @staticmethod
    def _check_key(request: web.BaseRequest, key: str | None, what: str) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise ApiError(
                401, f"missing or wrong {what}: send 'Authorization: Bearer KEY'", "unauthorized"
            )

    def _wrap(
        self, label: str, handler: Handler, check: Callable[[web.BaseRequest], None] | None
    ) -> Handler:
        metrics = self.metrics

        async def guarded(request: web.BaseRequest) -> web.StreamResponse:
            started = time.monotonic()
            status = 500
            try:
                if check is not None:
                    check(request)
                response = await handler(request)
                status = response.status
                return response
            except ApiError as error:
                status = error.status
                metrics.error(error.cause)
                return _error_response(error)
            except asyncio.CancelledError:
                status = CLIENT_CLOSED
                raise
            except Exception:
                log.exception("internal error on %s %s", request.method, request.path)
                metrics.error("internal")
                return web.Response(
                    body=error_body(500, "internal error in pdkit lb (see its log)"),
                    status=500,
                    content_type="application/json",
                )
            finally:
                metrics.request(label, status, time.monotonic() - started, False)

        return guarded

    def _open(self, label: str, handler: Handler) -> Handler:
        return self._wrap(label, handler, None)

    def _keyed(self, label: str, handler: Handler) -> Handler:
        key, limits = self.config.api_key, self.limits
        if limits is not None:  # a limited client's key opens these routes too

            def check(request: web.BaseRequest) -> None:
                limits.client(request.headers.get("Authorization", ""))

            return self._wrap(label, handler, check)
        return self._wrap(label, handler, lambda q: self._check_key(q, key, "API key"))

    def _admin_only(self, label: str, handler: Handler) -> Handler:
        key = self.config.admin_key

        def check(request: web.BaseRequest) -> None:
            if key is None:
                raise ApiError(
                    403,
                    "worker administration is off: start the load balancer with "
                    "PDKIT_LB_ADMIN_KEY or --admin-key-file",
                    "forbidden",
                )
            self._check_key(request, key, "admin key")

        return self._wrap(label, handler, check)

    # -- PD routes ---------------------------------------------------------------------------

    def _pd_handler(self, path: str) -> Handler:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            return await self._serve_pd(request, path)

        return handle

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.max_body_bytes
            raise ApiError(
                413,
                f"the request body is larger than {limit} bytes; raise "
                "--max-body-mb if such requests are expected",
                "payload_too_large",
            ) from None

    async def _serve_pd(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        started = time.monotonic()
        self.inflight += 1
        status = CLIENT_CLOSED
        stream = False
        ex: Exchange | None = None
        request_id = ""
        cause = ""
        try:
            try:
                if self.draining:
                    raise ApiError(503, "the load balancer is shutting down", "draining")
                limits = self.limits
                client = None
                if limits is None:
                    self._check_key(request, self.config.api_key, "API key")
                else:
                    client = limits.client(request.headers.get("Authorization", ""))
                    if client is not None:
                        limits.take_request(client)
                dispatcher = self._dispatcher
                if dispatcher is None:
                    raise ApiError(503, "the load balancer is starting", "starting")
                request_id = dispatcher.request_id(request)
                pd = parse_request(path, await self._read_body(request))
                stream = pd.stream
                self._check_prompt(pd)
                if client is not None and limits is not None:
                    limits.take_tokens(client, prompt_size(pd))
                ex = Exchange(request, pd, started, request_id)
                if self.config.migrate and stream and path != GENERATE:
                    if pd.ids is None:  # ids a client sent count without a tokenizer too
                        pd.ids = prompt_ids(pd, None)
                    bridge = self.config.chat_bridge
                    ex.follow = IdStream.plan(pd, self.tokenizer, self.context_length, bridge)
                response = await dispatcher.dispatch(ex)
            except ApiError as error:
                cause = error.cause
                response = await self._fail(ex, error, request_id)
            except asyncio.CancelledError:
                # The client went away (or the drain grace period ran out).
                cause = "shutdown" if self.draining else "client_disconnect"
                self.metrics.error(cause)
                if ex is not None:
                    ex.cause = cause
                raise
            except Exception:
                log.exception("internal error on %s", path)
                cause = "internal"
                response = await self._fail(
                    ex,
                    ApiError(500, "internal error in pdkit lb (see its log)", "internal"),
                    request_id,
                )
            status = response.status
            if ex is not None and "client_disconnect" in ex.causes:
                status = CLIENT_CLOSED
                ex.cause = ex.cause or "client_disconnect"
            return response
        finally:
            self.inflight -= 1
            if ex is not None:
                for cause in ex.causes:
                    self.metrics.error(cause)
                if ex.request_id:
                    self.recent.ended(ex.request_id, status)
            e2e = time.monotonic() - started
            self.metrics.request(path, status, e2e, stream)
            if self.access.enabled:
                if ex is not None:
                    self.access.exchange(ex, status, e2e)
                else:
                    admission = "off" if self.admission is None else "skipped"
                    self.access.refused(
                        request_id,
                        path,
                        status=status,
                        stream=stream,
                        e2e=e2e,
                        cause=cause,
                        admission=admission,
                    )

    def _check_prompt(self, pd: PdRequest) -> None:
        """The prompt's ids, once (`pd.ids`), and the checks before any worker sees it: what
        SGLang would crash on or refuse is a 400 here (`kit.lb.validate`)."""
        if self.tokenizer is not None or self.vocab_size is not None:
            pd.ids = prompt_ids(pd, self.vocab_size, self.tokenizer)
        if not self.config.validate:
            return
        refusal = check_request(
            pd.path,
            pd.body,
            pd.ids,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
        )
        if refusal is not None:
            raise ApiError(400, refusal.message, refusal.cause, param=refusal.param)

    def _log_failure(self, error: ApiError) -> None:
        """Log worker trouble (5xx), at most once a second per cause: a dead worker under load
        must not flood the log; the metrics count every one."""
        if error.status < 500:
            return
        now = time.monotonic()
        last, suppressed = self._logged.get(error.cause, (0.0, 0))
        if now - last < LOG_EVERY:
            self._logged[error.cause] = (last, suppressed + 1)
            return
        more = f" ({suppressed} more like it not logged)" if suppressed else ""
        log.warning("%s %s: %s%s", error.status, error.cause, error.message, more)
        self._logged[error.cause] = (now, 0)

    async def _fail(
        self, ex: Exchange | None, error: ApiError, request_id: str = ""
    ) -> web.StreamResponse:
        """Answer with `error`: a JSON error, or an error event if the stream already started."""
        self.metrics.error(error.cause)
        self._log_failure(error)
        if ex is not None:
            ex.cause = error.cause
        if ex is not None and ex.out is not None and ex.relay is not None:
            try:
                await ex.relay.fail(error)
            except Exception:  # the client is gone too; nothing left to tell it
                log.debug("could not send the error event", exc_info=True)
            return ex.out
        response = _error_response(error)
        if ex is not None:
            response.headers.update(path_headers(ex))
        elif request_id:
            response.headers["X-Request-Id"] = request_id
        if error.cause == "draining":
            response.force_close()
        return response

    # -- open routes -------------------------------------------------------------------------

    async def _health(self, request: web.BaseRequest) -> web.Response:
        status = "draining" if self.draining else "handover" if self.handing_over else "ok"
        return web.json_response({"status": status, "started": self.started})

    def readiness_report(self) -> tuple[bool, dict[str, object]]:
        """(ready, report): ready needs one routable prefill and decode and no drain."""
        now = time.monotonic()
        counts: dict[str, object] = {}
        roles: tuple[Role, ...] = ("prefill", "decode")
        for role in roles:
            counts[role] = {
                "healthy": len(self.pool.routable(role)),
                "total": len(self.pool.role(role)),
            }
        ready = (
            not self.draining
            and bool(self.pool.routable("prefill"))
            and bool(self.pool.routable("decode"))
        )
        out = [w.describe(now) for w in self.pool if not w.routable]
        report = {"ready": ready, "draining": self.draining, **counts, "out": out}
        if self.processes is not None:
            report["processes"] = self.processes.states()
        return ready, report

    async def _readiness(self, request: web.BaseRequest) -> web.Response:
        ready, report = self.readiness_report()
        return web.json_response(report, status=200 if ready else 503)

    async def _metrics(self, request: web.BaseRequest) -> web.Response:
        self.metrics.inflight = self.inflight
        body = self.metrics.render()
        if self.processes is not None and "local" not in request.query:
            body = await self.processes.metrics(body)  # every process's, labelled
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _refuse_method(self, request: web.BaseRequest) -> web.Response:
        allowed = ", ".join(sorted(self._routes.get(request.path, {})))
        raise ApiError(
            405,
            f"{request.method} is not allowed on {request.path} (use {allowed})",
            "method_not_allowed",
        )

    async def _no_route(self, request: web.BaseRequest) -> web.Response:
        raise ApiError(404, f"no route {request.path}", "not_found")
