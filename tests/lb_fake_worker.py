"""A fake SGLang PD worker for the load balancer tests: real sockets, no model.

It behaves like SGLang at the HTTP level where the load balancer can tell the difference:

- both roles refuse a request without `bootstrap_room` (400, SGLang's message), and check that
  `bootstrap_host`/`bootstrap_port`/`bootstrap_room` are well formed (lists of the batch size for
  a batched /generate);
- a prefill registers each room in a `Ledger` shared with the decodes (standing in for the
  bootstrap server and the KV transfer); a decode waits for its rooms' prefill to finish, checks
  that the prefill got the same body, host and bootstrap port, and only then generates (a decode
  whose prefill never comes fails after `kv_timeout`, as SGLang's does);
- logprobs as in PD: the prefill returns the input logprobs and its one output token, the decode
  empty input logprobs and all output tokens (the first one copied from the prefill);
- /generate (single and batch, stream or not), /v1/completions (echo + logprobs),
  /v1/chat/completions (stream or not, logprobs), /health, /v1/models, /model_info,
  /server_info, /flush_cache.

Faults: `fail_status`, `health_status`, `latency` (s before answering), `token_delay` (s between
streamed tokens), `die_after_tokens` (drop the connection mid-stream), `hang` (never answer).
Every handler that is cancelled (the load balancer closed the connection) is recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from kit.lb.config import parse_args
from kit.lb.server import LoadBalancer

MODEL = "fake-model"
ROOM_MAX = 2**63 - 1


@dataclass
class RoomRecord:
    host: str
    bootstrap_port: int | None
    body_hash: str
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Ledger:
    """What prefills saw, for decodes to check against; `problems` must stay empty."""

    rooms: dict[int, RoomRecord] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _body_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def lp(token_id: int, position: int) -> float:
    """The fake model's logprob of a token at a position (deterministic)."""
    return -round(0.1 + (token_id % 7) * 0.05 + position * 0.001, 6)


def prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, list):
        return [int(t) for t in prompt]
    return [sum(word.encode()) % 997 + 3 for word in str(prompt).split()] or [1]


def out_token(k: int) -> tuple[int, str]:
    return 500 + k, f" t{k}"


class FakeWorker:
    """One fake prefill or decode server; `await start()` returns its URL."""

    def __init__(
        self,
        role: str,
        ledger: Ledger,
        *,
        bootstrap_port: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        kv_timeout: float = 5.0,
    ) -> None:
        self.role = role
        self.ledger = ledger
        self.host = host
        self.port = port
        self.bootstrap_port = bootstrap_port
        self.kv_timeout = kv_timeout
        self.fail_status: int | None = None
        self.health_status = 200
        self.latency = 0.0
        self.token_delay = 0.0
        self.die_after_tokens: int | None = None
        self.hang = False
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.auth: list[str | None] = []  # Authorization header of every request seen
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        app = web.Application()
        for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self._infer)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_post("/flush_cache", self._flush)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- info -------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        return web.Response(
            status=self.health_status, text="" if self.health_status < 300 else "starting"
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "owned_by": "pdkit", "root": MODEL}],
            }
        )

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": MODEL, "is_generation": True, "disaggregation_mode": self.role}
        )

    async def _server_info(self, request: web.Request) -> web.Response:
        if self.fail_status:
            return web.json_response({"error": "broken"}, status=self.fail_status)
        return web.json_response(
            {
                "version": "fake",
                "disaggregation_mode": self.role,
                "port": self.port,
                "internal_states": [{"last_gen_throughput": 1.5}],
            }
        )

    async def _flush(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.")

    # -- inference --------------------------------------------------------------------------

    def _problem(self, text: str) -> None:
        self.ledger.problems.append(f"{self.role} {self.url}: {text}")

    def _rooms(self, body: dict[str, Any], batch: int | None) -> list[int] | None:
        host, port, room = (
            body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")
        )
        if room is None:
            return None
        if batch is None:
            hosts, ports, rooms = [host], [port], [room]
        else:
            if not all(isinstance(v, list) and len(v) == batch for v in (host, port, room)):
                self._problem(f"batch of {batch} without bootstrap lists of that size: {body}")
                return []
            hosts, ports, rooms = host, port, room
        for h, p, r in zip(hosts, ports, rooms, strict=True):
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= ROOM_MAX:
                self._problem(f"bad bootstrap_room {r!r}")
            if not isinstance(h, str) or not h:
                self._problem(f"bad bootstrap_host {h!r}")
            if p is not None and (not isinstance(p, int) or isinstance(p, bool)):
                self._problem(f"bad bootstrap_port {p!r}")
            if self.role == "prefill":
                if h != self.host:
                    self._problem(f"bootstrap_host {h} is not this prefill's host {self.host}")
                if p != self.bootstrap_port:
                    self._problem(f"bootstrap_port {p} is not this prefill's {self.bootstrap_port}")
        if len(set(rooms)) != len(rooms):
            self._problem("the same room twice in one request")
        return [int(r) for r in rooms]

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        body = await request.json()
        self.requests.append((path, body))
        self.auth.append(request.headers.get("Authorization"))
        batch = None
        if path == "/generate" and isinstance(body.get("text"), list):
            batch = len(body["text"])
        elif (
            path == "/generate" and body.get("input_ids") and isinstance(body["input_ids"][0], list)
        ):
            batch = len(body["input_ids"])
        rooms = self._rooms(body, batch)
        if rooms is None:
            return web.json_response(
                {"error": {"message": "Disaggregated request received without bootstrap room id"}},
                status=400,
            )
        try:
            return await self._answer(request, path, body, batch, rooms)
        except asyncio.CancelledError:
            self.cancelled.append(path)
            raise

    async def _answer(
        self,
        request: web.Request,
        path: str,
        body: dict[str, Any],
        batch: int | None,
        rooms: list[int],
    ) -> web.StreamResponse:
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail_status is not None:
            await asyncio.sleep(self.latency)
            return web.json_response(
                {
                    "object": "error",
                    "message": f"{self.role} failed on purpose",
                    "type": "BadRequestError",
                    "code": self.fail_status,
                },
                status=self.fail_status,
            )
        digest = _body_hash(body)
        if self.role == "prefill":
            records = []
            for room in rooms:
                record = RoomRecord(self.host, self.bootstrap_port, digest)
                self.ledger.rooms[room] = record
                records.append(record)
            await asyncio.sleep(self.latency)
            for record in records:
                record.done.set()
        else:
            deadline = time.monotonic() + self.kv_timeout
            for room in rooms:
                while room not in self.ledger.rooms:
                    if time.monotonic() > deadline:
                        return web.json_response(
                            {"error": {"message": "KV transfer timed out"}}, status=500
                        )
                    await asyncio.sleep(0.005)
                record = self.ledger.rooms[room]
                try:
                    async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                        await record.done.wait()
                except TimeoutError:
                    return web.json_response(
                        {"error": {"message": "KV transfer timed out"}}, status=500
                    )
                if record.body_hash != digest:
                    self._problem(f"room {room}: decode body differs from the prefill's")
            await asyncio.sleep(self.latency)
        if body.get("stream"):
            return await self._stream(request, path, body, batch)
        return web.json_response(self._result(path, body, batch))

    # -- response shapes --------------------------------------------------------------------

    def _n_out(self, path: str, body: dict[str, Any]) -> int:
        if self.role == "prefill":
            return 1
        if path == "/generate":
            return int((body.get("sampling_params") or {}).get("max_new_tokens", 4))
        return int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)

    def _prompts(self, path: str, body: dict[str, Any], batch: int | None) -> list[list[int]]:
        if path == "/generate":
            source = body.get("text") if body.get("text") is not None else body.get("input_ids")
            items = source if batch is not None else [source]
            return [prompt_ids(item) for item in items]
        if path == "/v1/completions":
            return [prompt_ids(body["prompt"])]
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
        return [prompt_ids(text)]

    def _native_item(self, prompt: list[int], n_out: int, logprob: bool, upto: int) -> dict:
        ids = [out_token(k)[0] for k in range(upto)]
        meta: dict[str, Any] = {
            "id": "fake",
            "prompt_tokens": len(prompt),
            "completion_tokens": upto,
            "finish_reason": {"type": "length", "length": n_out} if upto == n_out else None,
        }
        if logprob:
            meta["input_token_logprobs"] = (
                [[None if i == 0 else lp(t, i), t, None] for i, t in enumerate(prompt)]
                if self.role == "prefill"
                else []
            )
            meta["output_token_logprobs"] = [
                [lp(t, len(prompt) + k), t, None] for k, t in enumerate(ids)
            ]
        return {
            "text": "".join(out_token(k)[1] for k in range(upto)),
            "output_ids": ids,
            "meta_info": meta,
        }

    def _completion_lp(self, prompt: list[int], upto: int, echo: bool, start: int = 0) -> dict:
        entries: list[tuple[str, float | None]] = []
        if echo and self.role == "prefill" and start == 0:
            entries += [(f"p{t}", None if i == 0 else lp(t, i)) for i, t in enumerate(prompt)]
        for k in range(start, upto):
            token_id, text = out_token(k)
            entries.append((text, lp(token_id, len(prompt) + k)))
        return {
            "tokens": [e[0] for e in entries],
            "token_logprobs": [e[1] for e in entries],
            "text_offset": [-1] * len(entries),
            "top_logprobs": [{} for _ in entries],
        }

    def _result(self, path: str, body: dict[str, Any], batch: int | None) -> Any:
        n_out = self._n_out(path, body)
        prompts = self._prompts(path, body, batch)
        text = "".join(out_token(k)[1] for k in range(n_out))
        if path == "/generate":
            logprob = bool(body.get("return_logprob"))
            items = [self._native_item(p, n_out, logprob, n_out) for p in prompts]
            return items if batch is not None else items[0]
        usage = {
            "prompt_tokens": len(prompts[0]),
            "completion_tokens": n_out,
            "total_tokens": len(prompts[0]) + n_out,
        }
        if path == "/v1/completions":
            echo = bool(body.get("echo"))
            logprobs = (
                self._completion_lp(prompts[0], n_out, echo)
                if body.get("logprobs") is not None
                else None
            )
            return {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "text": (body["prompt"] if echo else "") + text,
                        "logprobs": logprobs,
                        "finish_reason": "length",
                    }
                ],
                "usage": usage,
            }
        chat_lp = None
        if body.get("logprobs"):
            chat_lp = {
                "content": [
                    {
                        "token": out_token(k)[1],
                        "logprob": lp(out_token(k)[0], len(prompts[0]) + k),
                        "top_logprobs": [],
                    }
                    for k in range(n_out)
                ]
            }
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": chat_lp,
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
        }

    def _events(self, path: str, body: dict[str, Any], batch: int | None) -> list[bytes]:
        n_out = self._n_out(path, body)
        prompts = self._prompts(path, body, batch)
        events: list[Any] = []
        for k in range(1, n_out + 1):
            if path == "/generate":
                logprob = bool(body.get("return_logprob"))
                for i, p in enumerate(prompts):
                    item = self._native_item(p, n_out, logprob, k)
                    if batch is not None:
                        item["index"] = i
                    events.append(item)
            elif path == "/v1/completions":
                echo = bool(body.get("echo"))
                text = out_token(k - 1)[1]
                if echo and k == 1:
                    text = body["prompt"] + text
                lp_obj = (
                    self._completion_lp(prompts[0], k, echo, start=k - 1)
                    if body.get("logprobs") is not None
                    else None
                )
                events.append(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "created": 0,
                        "model": MODEL,
                        "choices": [
                            {
                                "index": 0,
                                "text": text,
                                "logprobs": lp_obj,
                                "finish_reason": "length" if k == n_out else None,
                            }
                        ],
                    }
                )
            else:
                token_id, text = out_token(k - 1)
                delta: dict[str, Any] = {"content": text}
                if k == 1:
                    delta["role"] = "assistant"
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": "length" if k == n_out else None,
                }
                if body.get("logprobs"):
                    choice["logprobs"] = {
                        "content": [
                            {
                                "token": text,
                                "logprob": lp(token_id, len(prompts[0]) + k - 1),
                                "top_logprobs": [],
                            }
                        ]
                    }
                events.append(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": MODEL,
                        "choices": [choice],
                    }
                )
        return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]

    async def _stream(
        self, request: web.Request, path: str, body: dict[str, Any], batch: int | None
    ) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for count, event in enumerate(self._events(path, body, batch)):
            if self.die_after_tokens is not None and count >= self.die_after_tokens:
                if request.transport is not None:
                    request.transport.abort()
                return out
            if self.token_delay and count:
                await asyncio.sleep(self.token_delay)
            await out.write(event)
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out


# -- a load balancer in front of fake workers, all in this event loop ---------------------------

# Health settings that make tests fast: probe every 50 ms, eject after 2 failures, readmit after 2.
FAST_HEALTH = [
    "--health-interval",
    "0.05",
    "--health-timeout",
    "1",
    "--eject-after",
    "2",
    "--readmit-after",
    "2",
    "--eject-backoff",
    "0.2",
    "--eject-backoff-max",
    "0.5",
]


@dataclass
class Cluster:
    """A running load balancer (`url`) with its fake workers and a client session."""

    url: str
    prefill: list[FakeWorker]
    decode: list[FakeWorker]
    ledger: Ledger
    lb: LoadBalancer
    session: aiohttp.ClientSession

    async def post(
        self,
        path: str,
        payload: Any = None,
        *,
        data: bytes | None = None,
        key: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """POST and return (status, parsed JSON or raw bytes, response headers)."""
        hdrs = dict(headers or {})
        if key is not None:
            hdrs["Authorization"] = f"Bearer {key}"
        body = data if data is not None else json.dumps(payload).encode()
        async with self.session.post(self.url + path, data=body, headers=hdrs) as resp:
            raw = await resp.read()
            return resp.status, _maybe_json(raw), resp.headers

    async def get(self, path: str, *, key: str | None = None) -> Any:
        hdrs = {"Authorization": f"Bearer {key}"} if key is not None else {}
        async with self.session.get(self.url + path, headers=hdrs) as resp:
            raw = await resp.read()
            return resp.status, _maybe_json(raw), resp.headers

    async def wait_for(self, predicate: Any, timeout: float = 5.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or predicate}")
            await asyncio.sleep(0.01)

    def all_requests(self) -> list[tuple[str, dict[str, Any]]]:
        return [r for w in (*self.prefill, *self.decode) for r in w.requests]


def _maybe_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def sse_events(raw: bytes) -> list[Any]:
    """Payloads of an SSE body: parsed JSON, or the bytes (e.g. b'[DONE]')."""
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data = line[5:].strip()
                out.append(data if data == b"[DONE]" else json.loads(data))
    return out


class running_cluster:
    """Start `prefills` + `decodes` fake workers and a load balancer in front of them."""

    def __init__(
        self,
        prefills: int = 1,
        decodes: int = 1,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.prefills, self.decodes = prefills, decodes
        self.args = list(args or [])
        self.env = env or {}

    async def __aenter__(self) -> Cluster:
        ledger = Ledger()
        prefill = [
            FakeWorker("prefill", ledger, bootstrap_port=9000 + i) for i in range(self.prefills)
        ]
        decode = [FakeWorker("decode", ledger) for _ in range(self.decodes)]
        for worker in (*prefill, *decode):
            await worker.start()
        argv: list[str] = []
        for w in prefill:
            argv += ["--prefill", w.url, str(w.bootstrap_port)]
        for w in decode:
            argv += ["--decode", w.url]
        argv += ["--host", "127.0.0.1", "--port", "1", "--seed", "7", *FAST_HEALTH, *self.args]
        config = parse_args(argv, self.env)
        lb = LoadBalancer(config)
        await lb.start()
        runner = web.ServerRunner(lb.make_server(), shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        session = aiohttp.ClientSession()
        self._runner, self._session, self._lb = runner, session, lb
        self._workers = (*prefill, *decode)
        cluster = Cluster(f"http://127.0.0.1:{port}", prefill, decode, ledger, lb, session)
        self.cluster = cluster
        try:
            await cluster.wait_for(
                lambda: lb.readiness_report()[0] and all(w.routable for w in lb.pool),
                what="all workers healthy",
            )
        except BaseException:
            await self._close()
            raise
        return cluster

    async def _close(self) -> None:
        await self._session.close()
        await self._runner.cleanup()
        await self._lb.close()
        for worker in self._workers:
            await worker.stop()

    async def __aexit__(self, *exc: object) -> None:
        await self._close()
        assert not self.cluster.ledger.problems, self.cluster.ledger.problems


def run(coro: Any, timeout: float = 30.0) -> Any:
    """Run one async test scenario in a fresh event loop."""

    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())
