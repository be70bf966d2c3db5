"""The prefill's bootstrap server, and the rooms where a decode and a prefill meet.

SGLang's routes, with SGLang's behaviour: ``PUT /route`` (a prefill rank registers),
``GET /route`` (server info with all ranks -1, else one rank's address; 503 until every rank
registered), ``POST /register_dp_rank``, ``POST /query_dp_ranks`` and ``GET /health`` ("OK").

The sim's KV hand-off uses one more route on the rank address that ``/route`` returns (the
bootstrap server itself): ``POST /pdkit_sim/kv`` with the decode's reservation (room, Mooncake
session, destination extents, bytes per token). It is a long poll: the answer comes once the
prefill has computed the request and written its KV into the decode's buffer, with the
checksum and the first sampled token, or with the failure. The decode holds it open while it
waits, so a prefill that dies fails its waiting decode requests at once (connection reset),
and a decode that goes away fails the prefill request instead of leaving it to time out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

KV_PATH = "/pdkit_sim/kv"
MAX_RESERVATION_BYTES = 256 * 1024**2


class RoomError(RuntimeError):
    """A room hand-off that cannot proceed; the message is for the client."""


@dataclass
class Reservation:
    """A decode's reserved KV room for one bootstrap room."""

    room: int
    session: str
    extents: list[tuple[int, int]]
    bytes_per_token: int
    kv_tokens: int
    decode: str = ""
    created: float = field(default_factory=time.monotonic)
    result: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def cancelled(self) -> bool:
        return self.result.done()

    def complete(self, payload: dict[str, Any]) -> None:
        if not self.result.done():
            self.result.set_result(payload)


class RoomTable:
    """Rooms on a prefill: decode reservations and prefill requests waiting for them."""

    def __init__(self) -> None:
        self._reservations: dict[int, Reservation] = {}
        self._waiters: dict[int, asyncio.Future[Reservation]] = {}
        self._abandoned: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def offer(self, reservation: Reservation) -> None:
        """A decode reserved room for `reservation.room`."""
        room = reservation.room
        if room in self._reservations:
            raise RoomError(f"Duplicate decode bootstrap room {room}")
        if self._abandoned.pop(room, None) is not None:
            raise RoomError(f"The prefill request for bootstrap room {room} was aborted")
        self._reservations[room] = reservation
        waiter = self._waiters.pop(room, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(reservation)

    def withdraw(self, reservation: Reservation) -> None:
        """The decode went away: forget its reservation."""
        if self._reservations.get(reservation.room) is reservation:
            del self._reservations[reservation.room]
        reservation.complete({"status": "failed", "message": "decode withdrew"})

    async def wait(self, room: int, timeout_s: float) -> Reservation:
        """Wait until the decode for `room` has reserved KV room (the prefill's bootstrap
        queue); raise `RoomError` after `timeout_s` seconds, SGLang's message."""
        found = self._reservations.get(room)
        if found is not None:
            return found
        if room in self._waiters:
            raise RoomError(f"Duplicate or cancelled bootstrap room {room}")
        waiter: asyncio.Future[Reservation] = asyncio.get_running_loop().create_future()
        self._waiters[room] = waiter
        start = time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            raise RoomError(
                f"Request {room} timed out after {time.monotonic() - start:.1f}s in "
                "KVPoll.Bootstrapping"
            ) from None
        finally:
            if self._waiters.get(room) is waiter:
                del self._waiters[room]

    def release(self, room: int) -> None:
        """The prefill request for `room` is over."""
        self._reservations.pop(room, None)

    def abandon(self, room: int, keep_s: float = 600.0) -> None:
        """The prefill request for `room` was aborted: fail its decode's reservation, now or
        when it arrives (within `keep_s` seconds)."""
        now = time.monotonic()
        for old in [r for r, t in self._abandoned.items() if now - t > keep_s]:
            del self._abandoned[old]
        reservation = self._reservations.pop(room, None)
        if reservation is not None:
            reservation.complete(
                {
                    "status": "failed",
                    "message": f"The prefill request for bootstrap room {room} was aborted",
                }
            )
        else:
            self._abandoned[room] = now


class BootstrapServer:
    """SGLang's bootstrap routes plus the sim's KV hand-off, as an aiohttp app."""

    def __init__(self, rooms: RoomTable) -> None:
        self.rooms = rooms
        # A decode's reservation lists its KV extents: a long prompt in a fragmented pool
        # makes a message of megabytes (SGLang sends the same indices over ZMQ, unbounded).
        self.app = web.Application(client_max_size=MAX_RESERVATION_BYTES)
        self.info: dict[str, Any] = {}
        self.ranks: dict[tuple[int, int, int, int], dict[str, Any]] = {}
        self.expected = 0
        self.room_to_dp_rank: dict[int, int] = {}
        self.app.router.add_route("*", "/route", self._route)
        self.app.router.add_post("/register_dp_rank", self._register_dp_rank)
        self.app.router.add_post("/query_dp_ranks", self._query_dp_ranks)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_post(KV_PATH, self._kv)

    @property
    def ready(self) -> bool:
        return self.expected > 0 and len(self.ranks) >= self.expected

    def register(self, body: dict[str, Any]) -> None:
        """Record one rank (the body of SGLang's PUT /route)."""
        if not self.info:
            self.info = {
                "attn_tp_size": body["attn_tp_size"],
                "attn_cp_size": body.get("attn_cp_size", 1),
                "dp_size": body["attn_dp_size"]
                if body["system_dp_size"] == 1
                else body["system_dp_size"],
                "pp_size": body["pp_size"],
                "page_size": body["page_size"],
                "kv_cache_dtype": body["kv_cache_dtype"],
                "follow_bootstrap_room": body.get("load_balance_method", "follow_bootstrap_room")
                == "follow_bootstrap_room",
                "enable_dsa_cache_layer_split": False,
                "enable_kv_cache_sharding": False,
                "prefill_http_port": body.get("prefill_http_port"),
                "decode_allocation_policy": body.get("decode_allocation_policy", "early"),
            }
            info = self.info
            self.expected = (
                info["dp_size"] * info["attn_cp_size"] * info["attn_tp_size"] * info["pp_size"]
            )
        dp_group = body["attn_dp_rank"] if body["system_dp_size"] == 1 else body["system_dp_rank"]
        key = (dp_group, body.get("attn_cp_rank", 0), body["attn_tp_rank"], body["pp_rank"])
        self.ranks[key] = {"rank_ip": body["rank_ip"], "rank_port": int(body["rank_port"])}

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            try:
                self.register(await request.json())
            except (KeyError, TypeError, ValueError) as exc:
                return web.Response(text=f"Bad registration: {exc}", status=400)
            return web.Response(text="OK")
        if request.method != "GET":
            return web.Response(text="Method not allowed", status=405)
        q = request.query
        names = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(n) for n in names):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        try:
            key = tuple(int(q[n]) for n in names)
        except ValueError:
            return web.Response(text="Bad inputs for bootstrap server.", status=400)
        if not self.ready:
            return web.Response(
                text=f"Prefill server not fully registered yet ({len(self.ranks)} workers "
                "registered).",
                status=503,
            )
        if key == (-1, -1, -1, -1):
            return web.json_response(self.info)
        rank = self.ranks.get(key)  # type: ignore[arg-type]
        if rank is None:
            dp, cp, tp, pp = key
            return web.Response(
                text=f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} "
                f"pp_rank={pp}",
                status=404,
            )
        return web.json_response(rank)

    async def _register_dp_rank(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.room_to_dp_rank[int(data["bootstrap_room"])] = int(data["dp_rank"])
        return web.Response(text="OK")

    async def _query_dp_ranks(self, request: web.Request) -> web.Response:
        data = await request.json()
        rooms = [int(r) for r in data["bootstrap_rooms"]]
        return web.json_response(
            {str(r): self.room_to_dp_rank[r] for r in rooms if r in self.room_to_dp_rank}
        )

    async def _kv(self, request: web.Request) -> web.Response:
        """The decode's long poll for one room (see the module doc)."""
        try:
            body = await request.json()
            reservation = Reservation(
                room=int(body["room"]),
                session=str(body["session"]),
                extents=[(int(a), int(n)) for a, n in body["extents"]],
                bytes_per_token=int(body["bytes_per_token"]),
                kv_tokens=int(body["kv_tokens"]),
                decode=str(body.get("decode", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            return web.json_response(
                {"status": "failed", "message": f"bad request: {exc}"}, status=400
            )
        try:
            self.rooms.offer(reservation)
        except RoomError as exc:
            return web.json_response({"status": "failed", "message": str(exc)}, status=409)
        try:
            result = await reservation.result
        except asyncio.CancelledError:
            self.rooms.withdraw(reservation)
            raise
        return web.json_response(result)


def rank_registration(
    *,
    rank_ip: str,
    rank_port: int,
    dp_size: int,
    dp_rank: int,
    tp_size: int,
    page_size: int,
    kv_cache_dtype: str,
    http_port: int,
) -> dict[str, Any]:
    """The PUT /route body one sim rank registers (SGLang's field names)."""
    return {
        "attn_tp_size": 1,
        "attn_tp_rank": 0,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "attn_dp_size": dp_size,
        "attn_dp_rank": dp_rank,
        "pp_size": 1,
        "pp_rank": 0,
        "system_dp_size": 1,
        "system_dp_rank": 0,
        "rank_ip": rank_ip,
        "rank_port": rank_port,
        "page_size": page_size,
        "kv_cache_dtype": kv_cache_dtype,
        "prefill_http_port": http_port,
        "load_balance_method": "follow_bootstrap_room",
        "tp_size_emulated": tp_size,
    }
