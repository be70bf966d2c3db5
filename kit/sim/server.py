"""The worker's HTTP API (aiohttp), with SGLang's routes, status codes and error shapes.

Health: ``/health`` and ``/health_generate`` answer 503 while the emulated model loads and
while shutting down, then run a one-token probe through the scheduler (200 when it, or any
other request, makes progress within ``SGLANG_HEALTH_CHECK_TIMEOUT``). ``--api-key`` protects
every route but ``/health*``, ``/ready*`` and ``/metrics*``, as SGLang's middleware does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from kit.kvevents import wire
from kit.sim import api_native, api_openai, faults, role_switch
from kit.sim.engine import HEALTH_CHECK_PREFIX, Engine
from kit.sim.errors import RequestRefused, Stage
from kit.sim.metrics import SGLANG_VERSION, Metrics, loads, loads_prometheus
from kit.sim.requests import GenerateInput, RequestState
from kit.sim.schema import validation_message
from kit.sim.settings import FAULTS

log = logging.getLogger("kit.sim.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# SGLang's cuda_graph phases (sglang/srt/model_executor/graph_memory_usage.py).
CUDA_GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are "
    "running or waiting requests, the operation will not be performed.)\n"
)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")), status=status, content_type="application/json"
    )


def startup_phases(load_s: float, e2e_s: float) -> dict[str, Any]:
    """SGLang's /server_info ``startup_time``: startup phase durations in seconds (what
    ``build_engine_startup_time`` reports), not a point in time. The sim's phases: the emulated
    model load (`load_s`) and start-to-ready (`e2e_s`); it allocates and captures nothing."""
    return {
        "load_weight": round(load_s, 6),
        "kv_cache_allocation": 0.0,
        "scheduler_e2e": round(e2e_s, 6),
        "cuda_graph": dict.fromkeys(CUDA_GRAPH_PHASES, 0.0),
        "tokenizer_e2e": round(e2e_s, 6),
    }


def _validation_error(message: str) -> web.Response:
    """FastAPI's request validation error, as SGLang rewrites it (400)."""
    return _json(api_openai.error_body(message, 400, "Bad Request"), 400)


class Api:
    """Route handlers over one `Engine`; `ready`/`stopping` are set by the worker."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.metrics = Metrics(engine)
        self.ready = False
        self.stopping = False
        self.started = time.time()
        # SGLang's `startup_time` (`startup_phases`): None until the worker is ready.
        self.startup_time: dict[str, Any] | None = None
        self.generation_health = engine.settings.health_generation
        args = engine.args
        self.keys = (args.api_key, args.admin_api_key)
        self._live: dict[int, RequestState] = {}
        self.on_role_switch: Callable[[str], None] | None = None
        """Called with the new role after a switch (the worker registers a new prefill's
        ranks with its bootstrap server)."""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=64 * 1024**2)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ready", self.ready_route)
        r.add_get("/ping", self.ping)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model_card)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/metrics", self.metrics_route)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/abort_request", self.abort_request)
        r.add_post(faults.FAULT_ROUTE, self.set_fault)
        r.add_post("/pd_role_switch", self.pd_role_switch)
        return app

    # -- middleware ------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """FastAPI's JSON bodies for unknown routes and methods."""
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _json({"detail": "Not Found"}, 404)
        except web.HTTPMethodNotAllowed:
            return _json({"detail": "Method Not Allowed"}, 405)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        api_key, admin_key = self.keys
        if (
            (api_key or admin_key)
            and request.method != "OPTIONS"
            and not request.path.startswith(OPEN_PREFIXES)
        ):
            expected = (
                admin_key
                if request.path == "/flush_cache" and admin_key
                else (api_key or admin_key)
            )
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token, expected or ""):
                return _json({"error": "Unauthorized"}, 401)
        return await handler(request)

    # -- control -----------------------------------------------------------------------------

    async def pd_role_switch(self, request: web.Request) -> web.Response:
        """SGLang's runtime role switch (`kit.sim.role_switch`)."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        status, data = role_switch.switch(self.engine, body)
        if data["success"] and data["message"] == "ok" and self.on_role_switch is not None:
            self.on_role_switch(data["new_role"])
        return _json(data, status)

    # -- health and info -------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.stopping or not self.ready:
            return web.Response(status=503)
        if request.path == "/health" and not self.generation_health:
            return web.Response(status=200)
        return web.Response(status=200 if await self._probe() else 503)

    async def _probe(self) -> bool:
        """SGLang's health generate: a 1-token request; any progress of the worker counts."""
        engine = self.engine
        tic = time.monotonic()
        steps = engine.steps
        state = engine.submit(
            GenerateInput(
                rid=f"{HEALTH_CHECK_PREFIX}_{uuid.uuid4().hex}",
                prompt_ids=[0],
                max_new_tokens=1,
                health_check=True,
            )
        )
        deadline = tic + engine.settings.health_check_timeout_s
        try:
            while time.monotonic() < deadline:
                if engine.steps > steps:
                    return True  # the worker is computing: healthy, as SGLang decides
                if state.finish is not None:
                    return state.finish.kind != "abort"
                try:
                    await asyncio.wait_for(state.changed.wait(), 0.05)
                    state.changed.clear()
                except TimeoutError:
                    pass
            return False
        finally:
            if not state.done:
                engine.abort(state, "health check finished")

    async def ready_route(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready and not self.stopping else 503)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        e = self.engine
        return _json(
            {
                "model_path": e.args.model_path,
                "served_model_name": e.args.served_model_name,
                "tokenizer_path": e.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": e.args.disaggregation_mode,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": e.model.model_type or None,
                "architectures": list(e.model.architectures) or None,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        e = self.engine
        states: list[dict[str, Any]] = [
            {
                "dp_rank": i,
                "max_total_num_tokens": r.pool.capacity_tokens,
                "max_running_requests": r.max_running,
                "chunked_prefill_size": r.chunk_size,
                "page_size": r.pool.page_size,
                "new_token_ratio": round(r.new_token_ratio, 4),
                "num_running_reqs": r.num_running(),
                "num_queue_reqs": r.num_queued(),
                "token_usage": round(r.pool.usage(), 4),
                "last_gen_throughput": round(e.gen_throughput() / len(e.ranks), 3),
                # What a role-switching router feeds back as PdRoleSwitchReqInput (SGLang's
                # internal_state._add_disaggregation); the sim captures no CUDA graphs.
                "disaggregation_mode": e.mode.value,
                "decode_cuda_graph_bs": [],
                "decode_cuda_graph_memory_gb": 0.0,
            }
            for i, r in enumerate(e.ranks)
        ]
        lag = e.clock.lag
        return _json(
            {
                **e.args.as_dict(),
                "mem_fraction_static": e.mem_fraction,
                "chunked_prefill_size": e.chunk_size,
                "max_running_requests": e.max_running,
                "max_total_num_tokens": e.capacity_tokens,
                "context_length": e.context_len,
                "internal_states": states,
                "kv_events": self._kv_events(),
                "version": SGLANG_VERSION,
                "startup_time": self.startup_time,
                "frontend": "python",
                "engine": "pdkit-sim",
                "sim": {
                    "started_at": self.started,  # epoch s: SGLang reports no start time
                    "gpu": e.gpu.name,
                    "gpus": e.gpus,
                    "model": e.model.describe(),
                    # The tokenizer's vocabulary (kit.byte_tokenizer): what a router hashes
                    # text prompts with to look them up in this worker's KV events.
                    "vocab": e.model.vocab,
                    "speed": e.settings.speed,
                    "seed": e.seed,
                    "kv_scale": e.settings.kv_scale,
                    "kv_bytes_per_token": e.kv_bytes_per_token,
                    "kv_bytes_per_token_emulated": e.timing.kv_bytes_per_token,
                    "mooncake_session": e.kv.session if e.kv else None,
                    "kv_bytes_moved": e.pd.kv_bytes_moved,
                    "kv_transfers": e.pd.kv_transfers,
                    "kv_checksums_ok": e.pd.checksum_ok,
                    "kv_corrupted": e.pd.kv_corrupted,
                    "step_lag_mean_s": lag.mean_s,
                    "step_lag_p99_s": lag.quantile(0.99),
                    "step_lag_max_s": lag.max_s,
                    "steps": e.steps,
                },
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._card()]})

    def _card(self) -> dict[str, Any]:
        name = self.engine.args.served_model_name
        return {
            "id": name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.engine.context_len,
        }

    async def model_card(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model != self.engine.args.served_model_name:
            return _json(
                {
                    "error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                404,
            )
        return _json(self._card())

    async def loads(self, request: web.Request) -> web.Response:
        q = request.query
        include = {s.strip() for s in q["include"].split(",")} if q.get("include") else None
        try:
            dp_rank = int(q["dp_rank"]) if q.get("dp_rank") else None
            data = loads(self.engine, include, dp_rank)
        except ValueError as exc:
            return _json({"detail": str(exc)}, 400)
        if q.get("format") == "prometheus":
            return web.Response(
                text=loads_prometheus(data), content_type="text/plain", charset="utf-8"
            )
        return _json(data)

    async def metrics_route(self, request: web.Request) -> web.Response:
        if not self.engine.args.enable_metrics:
            return _json({"detail": "Not Found"}, 404)
        return web.Response(
            body=self.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    def _kv_events(self) -> dict[str, Any] | None:
        """SGLang's `/server_info` ``kv_events``: where this worker publishes its cache's
        events (None: it does not)."""
        e = self.engine
        config = e.args.kv_events
        if config is None or e.caching.caches is None:
            return None
        return wire.describe(
            port_base=int(config.endpoint.rpartition(":")[2]),
            topic=config.topic,
            block_size=e.args.page_size,
            dp_size=len(e.ranks),
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.engine.idle:
            for cache in self.engine.caching.caches or ():
                cache.clear()
            return web.Response(text=FLUSHED)
        return web.Response(text="Flush cache failed.\n", status=400)

    async def set_fault(self, request: web.Request) -> web.Response:
        """The emulator's own route (not SGLang's): turn a PDKIT_SIM_FAULT on or off while the
        worker runs, `{"fault": "corrupt"}` or `{"fault": null}`, for faults that appear in
        the field after hours of serving."""
        body = await request.json()
        fault = body.get("fault") if isinstance(body, dict) else None
        if fault is not None and fault not in FAULTS:
            raise web.HTTPBadRequest(text=f"fault must be one of {', '.join(FAULTS)} or null")
        self.engine.settings = replace(self.engine.settings, fault=fault)
        log.warning("PDKIT_SIM_FAULT is now %s", fault or "off")
        return web.json_response({"fault": fault})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid, everything = body.get("rid"), bool(body.get("abort_all"))
        for state in list(self._live.values()):
            if everything or state.inp.rid == rid or state.inp.rid.startswith(f"{rid}-"):
                self.engine.abort(state)
        return web.Response(status=200)

    # -- generation ------------------------------------------------------------------------

    def _start(self, inputs: list[GenerateInput]) -> list[RequestState]:
        states = [self.engine.submit(i) for i in inputs]
        for state in states:
            self._live[id(state)] = state
        return states

    def _end(self, states: list[RequestState]) -> None:
        for state in states:
            if not state.done:
                self.engine.abort(state)
            self._live.pop(id(state), None)
            if not state.inp.health_check:
                self.metrics.observe(state)

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except json.JSONDecodeError as exc:
            raise RequestRefused(
                validation_message(
                    [
                        {
                            "type": "json_invalid",
                            "loc": ("body", exc.pos),
                            "msg": "JSON decode error",
                            "input": {},
                            "ctx": {"error": exc.msg},
                        }
                    ]
                ),
                stage=Stage.SCHEMA,
            ) from exc
        except UnicodeDecodeError as exc:
            raise RequestRefused(f"Invalid JSON body: {exc}", stage=Stage.SCHEMA) from exc

    def _not_ready(self) -> web.Response | None:
        if self.ready and not self.stopping:
            return None
        what = "shutting down" if self.stopping else "loading the emulated model"
        return _json({"error": {"message": f"The server is not ready ({what})."}}, 503)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if (busy := self._not_ready()) is not None:
            return busy
        body: Any = None
        try:
            body = await self._body(request)
            inputs, as_list, stream = api_native.parse_generate(body, self.engine.limits)
        except RequestRefused as exc:
            if exc.stage is Stage.SCHEMA:
                return _validation_error(str(exc))
            if exc.stage is Stage.CONTRACT:
                return _json({"error": str(exc)}, exc.status)
            if isinstance(body, dict) and body.get("stream") is True:
                return await self._stream_refusal(request, str(exc), exc.status)
            return _json({"error": {"message": str(exc)}}, exc.status)
        states = self._start(inputs)
        try:
            if stream:
                return await self._stream_native(request, states, as_list)
            await asyncio.gather(*(s.wait_done() for s in states))
            for state in states:
                error = api_native.error_of(state)
                if error is not None:
                    status, message = error
                    if status == 400:
                        return _json({"error": {"message": message}}, 400)
                    return _json(api_openai.error_body(message, status, str(status)), status)
            outputs = [api_native.output(s) for s in states]
            return _json(outputs if as_list else outputs[0])
        finally:
            self._end(states)

    async def _stream_native(
        self, request: web.Request, states: list[RequestState], as_list: bool
    ) -> web.StreamResponse:
        response = await self._sse(request)
        pending = set(range(len(states)))
        while pending:
            await _any_change([states[i] for i in pending])
            for i in sorted(pending):
                state = states[i]
                if not state.output_ids and not state.done:
                    continue
                chunk = api_native.output_json(state, i if as_list else None)
                await response.write(f"data: {chunk}\n\n".encode())
                if state.done:
                    pending.discard(i)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        return response

    async def _stream_refusal(
        self, request: web.Request, message: str, status: int
    ) -> web.StreamResponse:
        """A streamed /generate the tokenizer manager refuses: SGLang has answered 200 and
        sends the error as an event (http_server.py, serve_generate_request)."""
        response = await self._sse(request)
        error = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "code": status,
                "retryable": False,
            }
        }
        await response.write(f"data: {json.dumps(error)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if request.content_type != "application/json":
            return _validation_error("Unsupported Media Type: Only 'application/json' is allowed")
        if (busy := self._not_ready()) is not None:
            return busy
        engine = self.engine
        try:
            body = await self._body(request)
            parse = api_openai.parse_chat if chat else api_openai.parse_completion
            inputs = parse(body, engine.limits)
        except RequestRefused as exc:
            if exc.stage is Stage.SCHEMA:
                return _validation_error(str(exc))
            return _json(api_openai.error_body(str(exc), exc.status), exc.status)
        # Read from the parsed inputs: pydantic's lax mode takes "false" for stream, "2" for n.
        n = 1 + max(i.sample_index for i in inputs)
        echo = None if chat else api_openai.completion_echo(body, n)
        model = str(body.get("model") or engine.args.served_model_name)
        states = self._start(inputs)
        try:
            if inputs[0].stream:
                return await self._stream_openai(
                    request, states, chat=chat, model=model, n=n, body=body, echo=echo
                )
            await asyncio.gather(*(s.wait_done() for s in states))
            for state in states:
                error = api_native.error_of(state)
                if error is not None:
                    status, message = error
                    kind = "BadRequest" if status == 400 else str(status)
                    return _json(api_openai.error_body(message, status, kind), status)
            cache = self._cache_report(body)
            if chat:
                return _json(api_openai.chat_response(states, model, n, cache))
            return _json(api_openai.completion_response(states, model, n, echo, cache))
        finally:
            self._end(states)

    def _cache_report(self, body: dict[str, Any]) -> api_openai.CacheReport:
        return api_openai.CacheReport(
            usage=self.engine.args.enable_cache_report,
            details=body.get("return_cached_tokens_details") is True,
        )

    async def _stream_openai(
        self,
        request: web.Request,
        states: list[RequestState],
        *,
        chat: bool,
        model: str,
        n: int,
        body: dict[str, Any],
        echo: api_openai.Echo | None = None,
    ) -> web.StreamResponse:
        # Like SGLang, wait for the first output before sending 200. What the scheduler
        # refuses arrives as that first output: SGLang sends it as a stream error event.
        while not any(s.output_ids or s.done for s in states):
            await _any_change(states)
        response = await self._sse(request)
        fmt = api_openai.StreamFormatter(chat, model, states, echo)
        pending = set(range(len(states)))
        while True:
            for i in sorted(pending):
                for chunk in fmt.updates(i):
                    await response.write(chunk.encode())
                error = api_native.error_of(states[i])
                if error is not None:
                    await response.write(api_openai.stream_error(error[1], error[0]).encode())
                    pending.clear()
                    break
                if states[i].done:
                    pending.discard(i)
            if not pending:
                break
            await _any_change([states[i] for i in pending])
        options = body.get("stream_options") or {}
        if options.get("include_usage") and all(api_native.error_of(s) is None for s in states):
            await response.write(fmt.usage_chunk(n, self._cache_report(body)).encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _any_change(states: list[RequestState]) -> None:
    """Wait until one of `states` changes."""
    if len(states) == 1:
        await states[0].wait_change()
        return
    if any(s.changed.is_set() for s in states):
        for s in states:
            s.changed.clear()
        return
    waits = [asyncio.ensure_future(s.changed.wait()) for s in states]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        for s in states:
            s.changed.clear()
