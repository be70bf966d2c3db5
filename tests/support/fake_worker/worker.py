"""One fake SGLang worker (prefill, decode, or a non-PD `null` worker) and the Ledger of rooms.

It behaves like SGLang at the HTTP level where a PD router can tell the difference:

- prefill and decode refuse a request without `bootstrap_room` (400, SGLang's message), and
  check that `bootstrap_host`/`bootstrap_port`/`bootstrap_room` are well formed (lists of the
  batch size for a batched /generate);
- a prefill checks that the bootstrap host and port are its own and registers each room in a
  `Ledger` shared with the decodes (standing in for the bootstrap server and the KV transfer); a
  decode waits for its rooms' prefill to finish, checks that the prefill got the same body, and
  only then generates (a decode whose prefill never comes fails after `kv_timeout`, as SGLang's
  does);
- logprobs as in PD (see `model`); /generate (single and batch, stream or not),
  /v1/completions, /v1/chat/completions, /health, /health_generate, /ready, /ping, /v1/models,
  /model_info, /server_info, /v1/loads, /metrics, /flush_cache; any other path is a 404, as
  SGLang's, counted in `not_found`.

Whatever a router gets wrong lands in `Ledger.problems` (a test fails on any). Faults, settable at
any time: `fail_status`, `health_status`, `latency` (s before answering), `token_delay` (s between
streamed tokens), `die_after_tokens` (drop the connection mid-stream), `hang` (never answer),
`corrupt` (a decode's answer has other tokens from the second on, as from altered KV),
`drop_next` (drop the connection of the next N inference requests, unanswered, and live on),
`die_on` (a request whose body holds this text kills the worker, as a poison request kills
SGLang: it stops listening and drops every connection; `start()` brings it back).
Every inference request whose client went away first is recorded in `cancelled`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_worker.http1 import HttpServer, Reply, Request
from tests.support.fake_worker.model import CHAT, COMPLETIONS, MODEL, NATIVE, Shapes

ROLES = ("prefill", "decode", "null")
ROOM_MAX = 2**63 - 1
NO_ROOM = "Disaggregated request received without bootstrap room id"
DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class Room:
    """One bootstrap room: the body its prefill got, and whether that prefill has finished."""

    body: dict[str, Any] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Ledger:
    """Rooms between prefills and decodes; `problems` must stay empty.

    A decode takes its room out when it has checked it, so a long run holds only rooms in flight.
    """

    rooms: dict[int, Room] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def room(self, room_id: int) -> Room:
        room = self.rooms.get(room_id)
        if room is None:
            room = self.rooms[room_id] = Room()
        return room


class FakeWorker:
    """One fake prefill, decode or null worker; `await start()` returns its URL.

    With `record` (the default) every request body and Authorization header is kept for tests to
    read (`requests`, `auth`); a benchmark turns it off and reads the counters.
    """

    def __init__(
        self,
        role: str,
        ledger: Ledger,
        *,
        bootstrap_port: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        kv_timeout: float = 5.0,
        record: bool = True,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role {role!r}: use one of {', '.join(ROLES)}")
        self.role = role
        self.ledger = ledger
        self.host = host
        self.port = port
        self.bootstrap_port = bootstrap_port
        self.kv_timeout = kv_timeout
        self.record = record
        self.fail_status: int | None = None
        self.sim_vocab: int | None = None
        """Reported in /server_info as an emulated worker's (``sim.vocab``) when set."""
        self.health_status = 200
        self.latency = 0.0
        self.token_delay = 0.0
        self.die_after_tokens: int | None = None
        self.hang = False
        self.corrupt = False  # a decode answers other tokens (/generate), as altered KV does
        self.drop_next = 0
        self.die_on: str | None = None
        self._dying: asyncio.Task[None] | None = None
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.auth: list[str | None] = []  # Authorization header of every request seen
        self.served: Counter[str] = Counter()  # inference requests answered, by path
        self.not_found: Counter[str] = Counter()  # "GET /path" asked that SGLang does not serve
        self.inflight = 0  # requests held across an await: faults, latency, waiting for KV
        self._server = HttpServer(self.handle)
        self._routes = {
            ("POST", NATIVE): self._infer,
            ("PUT", NATIVE): self._infer,
            ("POST", COMPLETIONS): self._infer,
            ("POST", CHAT): self._infer,
            ("GET", "/health"): self._health,
            ("GET", "/health_generate"): self._health,
            ("GET", "/ready"): self._health,
            ("GET", "/ping"): self._ping,
            ("GET", "/v1/models"): self._models,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/get_model_info"): self._model_info,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_server_info"): self._server_info,
            ("GET", "/v1/loads"): self._loads,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/flush_cache"): self._flush,
            ("POST", "/flush_cache"): self._flush,
        }

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        self.port = await self._server.listen(self.host, self.port)
        return self.url

    async def stop(self) -> None:
        """Stop listening and drop every open connection (as a killed worker would)."""
        await self._server.close()

    def handle(self, request: Request, reply: Reply) -> Coroutine[Any, Any, None] | None:
        route = self._routes.get((request.method, request.path))
        if route is None:
            self.not_found[f"{request.method} {request.path}"] += 1
            reply.json(404, {"detail": "Not Found"})
            return None
        return route(request, reply)

    # -- info -------------------------------------------------------------------------------

    def _health(self, request: Request, reply: Reply) -> None:
        if self.record:
            self.auth.append(request.headers.get("authorization"))
        reply.text(self.health_status, "" if self.health_status < 300 else "starting")

    def _ping(self, request: Request, reply: Reply) -> None:
        reply.text(200, "")

    def _models(self, request: Request, reply: Reply) -> None:
        reply.json(
            200,
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "owned_by": "pdkit", "root": MODEL}],
            },
        )

    def _model_info(self, request: Request, reply: Reply) -> None:
        reply.json(
            200,
            {
                "model_path": MODEL,
                "tokenizer_path": MODEL,
                "served_model_name": MODEL,
                "is_generation": True,
                "disaggregation_mode": self.role,
            },
        )

    def _server_info(self, request: Request, reply: Reply) -> None:
        if self.fail_status:
            reply.json(self.fail_status, {"error": "broken"})
            return
        reply.json(
            200,
            {
                "version": "fake",
                "model_path": MODEL,
                "served_model_name": MODEL,
                "disaggregation_mode": self.role,
                "port": self.port,
                "internal_states": [{"last_gen_throughput": 1.5}],
                **({"sim": {"vocab": self.sim_vocab}} if self.sim_vocab else {}),
            },
        )

    def _loads(self, request: Request, reply: Reply) -> None:
        reply.json(
            200,
            {
                "timestamp": time.time(),
                "loads": [{"dp_rank": 0, "num_running_reqs": self.inflight, "num_waiting_reqs": 0}],
            },
        )

    def _metrics(self, request: Request, reply: Reply) -> None:
        reply.send(
            200,
            b"# TYPE sglang:num_running_reqs gauge\n"
            b'sglang:num_running_reqs{model_name="%s"} %d.0\n' % (MODEL.encode(), self.inflight),
            b"text/plain; version=0.0.4; charset=utf-8",
        )

    def _flush(self, request: Request, reply: Reply) -> None:
        reply.text(200, "Cache flushed.")

    # -- inference --------------------------------------------------------------------------

    def _problem(self, text: str) -> None:
        self.ledger.problems.append(f"{self.role} {self.url}: {text}")

    def _rooms(self, body: dict[str, Any], batch: int | None) -> list[int] | None:
        """The request's rooms after checking its bootstrap fields; None if it has none."""
        fields: list[Any] = [
            body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")
        ]
        host, port, room = fields
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

    def _infer(self, request: Request, reply: Reply) -> Coroutine[Any, Any, None] | None:
        path = request.path
        try:
            body = json.loads(request.body)
        except ValueError:
            reply.json(400, {"error": {"message": "the body is not valid JSON"}})
            return None
        if not isinstance(body, dict):
            reply.json(400, {"error": {"message": "the body is not a JSON object"}})
            return None
        if self.record:
            self.requests.append((path, body))
            self.auth.append(request.headers.get("authorization"))
        if self.drop_next > 0:
            self.drop_next -= 1
            reply.abort()
            return None
        if self.die_on is not None and self.die_on in request.body.decode("utf-8", "replace"):
            reply.abort()
            self._server.kill()
            self._dying = asyncio.get_running_loop().create_task(self.stop())
            return None
        batch = None
        if path == NATIVE and isinstance(body.get("text"), list):
            batch = len(body["text"])
        elif path == NATIVE and body.get("input_ids") and isinstance(body["input_ids"][0], list):
            batch = len(body["input_ids"])
        rooms: list[int] = []
        if self.role != "null":
            checked = self._rooms(body, batch)
            if checked is None:
                reply.json(400, {"error": {"message": NO_ROOM}})
                return None
            rooms = checked
        shapes = Shapes(self.role, path, body, batch)
        if self._quick(body):
            if self.role == "prefill":
                for room in self._claim(rooms, body):
                    room.done.set()
                return self._answer(shapes, reply)
            if self._prefilled(rooms, body):
                return self._answer(shapes, reply)
        return self._slow(request, reply, shapes, rooms)

    def _quick(self, body: dict[str, Any]) -> bool:
        """Whether this worker can answer without waiting (no fault, latency or token delay);
        a decode also needs its prefills done."""
        return not (
            self.hang
            or self.latency
            or self.fail_status is not None
            or (self.token_delay and body.get("stream"))
        )

    def _claim(self, rooms: list[int], body: dict[str, Any]) -> list[Room]:
        """Register a prefill's rooms: its host, bootstrap port and body, for decodes to check."""
        claimed = []
        for room_id in rooms:
            room = self.ledger.room(room_id)
            if room.body is not None:
                self._problem(f"room {room_id} was already used by another prefill")
            room.body = body
            claimed.append(room)
        return claimed

    def _prefilled(self, rooms: list[int], body: dict[str, Any]) -> bool:
        """If every room's prefill has finished: check each against this decode's body, release
        them, and say True; else change nothing and say False."""
        ledger = self.ledger
        if not all((r := ledger.rooms.get(room_id)) and r.done.is_set() for room_id in rooms):
            return False
        for room_id in rooms:
            room = ledger.rooms.pop(room_id)
            if room.body != body:
                self._problem(f"room {room_id}: decode body differs from the prefill's")
        return True

    async def _kv_arrived(self, rooms: list[int], body: dict[str, Any]) -> bool:
        """Wait up to `kv_timeout` for every room's prefill to finish, then check and release."""
        waiting = [self.ledger.room(room_id) for room_id in rooms]
        arrived = False
        try:
            async with asyncio.timeout(self.kv_timeout):
                for room in waiting:
                    await room.done.wait()
            arrived = True
        except TimeoutError:
            pass
        finally:
            if not arrived:  # timed out or cancelled: this decode will not take its rooms
                for room_id in rooms:
                    self.ledger.rooms.pop(room_id, None)
        return arrived and self._prefilled(rooms, body)

    async def _slow(self, request: Request, reply: Reply, shapes: Shapes, rooms: list[int]) -> None:
        self.inflight += 1
        try:
            if self.hang:
                await asyncio.sleep(3600)
            if self.fail_status is not None:
                await asyncio.sleep(self.latency)
                reply.json(
                    self.fail_status,
                    {
                        "object": "error",
                        "message": f"{self.role} failed on purpose",
                        "type": "BadRequestError",
                        "code": self.fail_status,
                    },
                )
                return
            if self.role == "prefill":
                claimed = self._claim(rooms, shapes.body)
                await asyncio.sleep(self.latency)
                for room in claimed:
                    room.done.set()
            else:
                if not await self._kv_arrived(rooms, shapes.body):
                    reply.json(500, {"error": {"message": "KV transfer timed out"}})
                    return
                await asyncio.sleep(self.latency)
            pending = self._answer(shapes, reply)
            if pending is not None:
                await pending
        except asyncio.CancelledError:
            self.cancelled.append(request.path)
            raise
        finally:
            self.inflight -= 1

    def _answer(self, shapes: Shapes, reply: Reply) -> Coroutine[Any, Any, None] | None:
        """Send the answer, or return the coroutine that streams it `token_delay` apart."""
        self.served[shapes.path] += 1
        if not shapes.body.get("stream"):
            reply.send(200, _corrupted(shapes) if self.corrupt else shapes.result_bytes())
            return None
        reply.start_stream()
        events = shapes.events()
        dies = self.die_after_tokens is not None and self.die_after_tokens < len(events)
        if dies:
            events = events[: self.die_after_tokens]
        if self.token_delay and events:
            return self._paced(events, reply, dies)
        _last(reply, events, dies)
        return None

    async def _paced(self, events: list[bytes], reply: Reply, dies: bool) -> None:
        """Write the events `token_delay` apart. Timer callbacks write them (a task waking up
        per token would cost the fake more CPU than some routers spend per request)."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        timer: asyncio.TimerHandle | None = None

        def step(k: int) -> None:
            nonlocal timer
            if k + 1 < len(events):
                reply.write(events[k])
                timer = loop.call_later(self.token_delay, step, k + 1)
            else:
                _last(reply, events[k:], dies)
                finished.set_result(None)

        step(0)
        try:
            await finished
        finally:
            if timer is not None:
                timer.cancel()

    def events(self, path: str, body: dict[str, Any], batch: int | None = None) -> list[bytes]:
        """The SSE events this worker streams for a request (without the final `[DONE]`)."""
        return Shapes(self.role, path, body, batch).events()


def _last(reply: Reply, events: list[bytes], dies: bool) -> None:
    """The last events of a stream, then `[DONE]` and its end, or a dropped connection."""
    if dies:
        reply.write(*events)
        reply.abort()
    else:
        reply.end_stream(*events, DONE)


def _corrupted(shapes: Shapes) -> bytes:
    """A non-streamed answer whose tokens after the first (the prefill's) are other ones."""
    result = json.loads(shapes.result_bytes())
    for item in result if isinstance(result, list) else [result]:
        if isinstance(item, dict) and isinstance(item.get("output_ids"), list):
            item["output_ids"] = item["output_ids"][:1] + [i + 1 for i in item["output_ids"][1:]]
            item["text"] = "wrong" + item["text"]
    return json.dumps(result).encode()
