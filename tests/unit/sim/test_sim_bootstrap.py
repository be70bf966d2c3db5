"""The prefill's bootstrap server and the decode's prefill directory, in-process."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kit.sim.bootstrap import (
    KV_PATH,
    BootstrapServer,
    Reservation,
    RoomError,
    RoomTable,
    rank_registration,
)
from kit.sim.pd_client import PdError, PrefillDirectory

ALL = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


def registration(port, dp_rank=0, dp_size=2):
    return rank_registration(
        rank_ip="127.0.0.1",
        rank_port=port,
        dp_size=dp_size,
        dp_rank=dp_rank,
        tp_size=1,
        page_size=16,
        kv_cache_dtype="auto",
        http_port=30000,
    )


def test_route_is_503_until_every_rank_registered():
    async def main():
        server = TestServer(
            BootstrapServer(RoomTable()).app, host="127.0.0.1", handler_cancellation=True
        )
        await server.start_server()
        async with aiohttp.ClientSession() as http:
            async with http.get(server.make_url(f"/route?{ALL}")) as r:
                assert r.status == 503 and "not fully registered" in await r.text()
            async with http.get(server.make_url("/route")) as r:
                assert r.status == 400
            for rank in (0, 1):
                async with http.put(
                    server.make_url("/route"), json=registration(server.port, rank)
                ) as r:
                    assert r.status == 200
            async with http.get(server.make_url(f"/route?{ALL}")) as r:
                info = await r.json()
                assert (info["dp_size"], info["page_size"]) == (2, 16)
                assert info["follow_bootstrap_room"] is True
            query = "prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
            async with http.get(server.make_url(f"/route?{query}")) as r:
                assert await r.json() == {"rank_ip": "127.0.0.1", "rank_port": server.port}
            async with http.get(server.make_url(f"/route?{query.replace('=1', '=5', 1)}")) as r:
                assert r.status == 404
            async with http.get(server.make_url("/health")) as r:
                assert await r.text() == "OK"
            async with http.post(
                server.make_url("/register_dp_rank"), json={"bootstrap_room": 9, "dp_rank": 1}
            ) as r:
                assert r.status == 200
            async with http.post(
                server.make_url("/query_dp_ranks"), json={"bootstrap_rooms": [9, 10]}
            ) as r:
                assert await r.json() == {"9": 1}
        await server.close()

    asyncio.run(main())


def test_rooms_meet_in_either_order_and_time_out():
    async def main():
        rooms = RoomTable()
        with pytest.raises(
            RoomError,
            match=r"Request 1 timed out after 0\.\d+s in "
            "KVPoll.Bootstrapping",
        ):
            await rooms.wait(1, 0.05)
        server = BootstrapServer(rooms)
        test = TestServer(server.app, host="127.0.0.1", handler_cancellation=True)
        await test.start_server()
        body = {
            "room": 2,
            "session": "127.0.0.1:1",
            "extents": [[0, 64]],
            "bytes_per_token": 4,
            "kv_tokens": 16,
        }
        async with aiohttp.ClientSession() as http:
            poll = asyncio.ensure_future(http.post(test.make_url(KV_PATH), json=body))
            reservation = await rooms.wait(2, 5)  # the decode came first
            assert reservation.extents == [(0, 64)]
            async with http.post(test.make_url(KV_PATH), json=body) as dup:
                assert dup.status == 409  # SGLang: duplicate decode bootstrap room
            reservation.complete({"status": "ok", "checksum": 1})
            async with await poll as r:
                assert await r.json() == {"status": "ok", "checksum": 1}
        await test.close()

    asyncio.run(main())


def test_a_fragmented_reservation_of_megabytes_is_accepted():
    async def main():
        rooms = RoomTable()
        test = TestServer(BootstrapServer(rooms).app, host="127.0.0.1")
        await test.start_server()
        extents = [[1_000_000 + 64 * i, 32] for i in range(0, 200_000, 2)]  # ~2 MB of JSON
        body = {
            "room": 8,
            "session": "s",
            "extents": extents,
            "bytes_per_token": 32,
            "kv_tokens": len(extents),
        }
        async with aiohttp.ClientSession() as http:
            poll = asyncio.ensure_future(http.post(test.make_url(KV_PATH), json=body))
            reservation = await rooms.wait(8, 10)
            assert len(reservation.extents) == 100_000
            reservation.complete({"status": "ok"})
            async with await poll as r:
                assert r.status == 200
        await test.close()

    asyncio.run(main())


def test_decode_withdrawing_its_poll_is_seen_by_the_prefill():
    async def main():
        rooms = RoomTable()
        test = TestServer(BootstrapServer(rooms).app, host="127.0.0.1", handler_cancellation=True)
        await test.start_server()
        body = {"room": 3, "session": "s", "extents": [], "bytes_per_token": 1, "kv_tokens": 0}
        async with aiohttp.ClientSession() as http:
            poll = asyncio.ensure_future(http.post(test.make_url(KV_PATH), json=body))
            reservation = await rooms.wait(3, 5)
            poll.cancel()
            for _ in range(100):
                if reservation.cancelled:
                    break
                await asyncio.sleep(0.01)
        await test.close()
        return reservation

    # The handler is cancelled with its connection (handler_cancellation, as in the worker).
    reservation = asyncio.run(main())
    assert reservation.cancelled


def test_heartbeat_fails_waiting_rooms_of_a_hung_prefill():
    async def main():
        state = {"hang": False}

        async def health(request):
            if state["hang"]:
                await asyncio.sleep(30)
            return web.Response(text="OK")

        async def route(request):
            if request.query.get("prefill_dp_rank") == "-1":
                return web.json_response({"dp_size": 1, "page_size": 16, "kv_cache_dtype": "auto"})
            return web.json_response({"rank_ip": "127.0.0.1", "rank_port": server.port})

        async def kv(request):
            await asyncio.sleep(30)  # the KV never comes
            return web.json_response({"status": "ok"})

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/route", route)
        app.router.add_post(KV_PATH, kv)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        directory = PrefillDirectory(
            bootstrap_timeout_s=5,
            waiting_timeout_s=60,
            heartbeat_interval_s=0.1,
            heartbeat_max_failure=2,
            heartbeat_timeout_s=(0.2, 0.2),
        )
        addr = f"127.0.0.1:{server.port}"
        fetch = asyncio.ensure_future(directory.fetch_kv(addr, 7, {"room": 7}))
        await asyncio.sleep(0.3)
        assert not fetch.done()  # healthy prefill: the room keeps waiting
        state["hang"] = True
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(PdError, match="Lost connection with prefill instance"):
            await fetch
        elapsed = loop.time() - t0
        await directory.close()
        await server.close()
        return elapsed

    assert asyncio.run(main()) < 2.0


def test_unreachable_prefill_fails_at_once():
    async def main():
        directory = PrefillDirectory(
            bootstrap_timeout_s=30,
            waiting_timeout_s=30,
            heartbeat_interval_s=2,
            heartbeat_max_failure=2,
        )
        with pytest.raises(PdError, match="Could not fetch prefill parallel info"):
            await directory.prefill_info("127.0.0.1:9")
        await directory.close()

    asyncio.run(main())


def test_an_aborted_prefill_request_fails_its_decodes_reservation():
    async def main():
        rooms = RoomTable()
        rooms.abandon(5)  # aborted before the decode reserved
        with pytest.raises(RoomError, match="aborted"):
            rooms.offer(Reservation(5, "s", [], 1, 0))
        reservation = Reservation(6, "s", [], 1, 0)
        rooms.offer(reservation)
        rooms.abandon(6)  # aborted after
        assert (await reservation.result)["status"] == "failed"

    asyncio.run(main())
