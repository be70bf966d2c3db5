"""The fake PD worker (tests.support.fake_worker) at the HTTP level, where the load balancer tests
do not reach: raw HTTP/1.1 framing, the PD hand-off between a prefill and a decode, and what it
reports when a client gets the PD protocol wrong."""

from __future__ import annotations

import asyncio
import json

from tests.support.fake_worker import FakeWorker, Ledger
from tests.support.lb_cluster import run, sse_events


async def exchange(port: int, raw: bytes, answers: int = 1) -> list[tuple[int, dict, bytes]]:
    """Send raw bytes on one connection; read `answers` responses: (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    out = []
    for _ in range(answers):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        while head.startswith("HTTP/1.1 100"):
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readuntil(b"\r\n")
        else:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        out.append((int(lines[0].split()[1]), headers, body))
    writer.close()
    return out


def post(path: str, body: dict, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode()
        + data
    )


def pd_body(room: int, bootstrap_port: int | None, **more) -> dict:
    return {
        "text": "a b c",
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": room,
        "sampling_params": {"max_new_tokens": 3},
        **more,
    }


class Pair:
    """One prefill and one decode sharing a Ledger."""

    async def __aenter__(self) -> Pair:
        self.ledger = Ledger()
        self.prefill = FakeWorker("prefill", self.ledger, bootstrap_port=8998)
        self.decode = FakeWorker("decode", self.ledger, kv_timeout=0.3)
        await self.prefill.start()
        await self.decode.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.prefill.stop()
        await self.decode.stop()


def test_a_decode_answers_only_after_its_prefill_whichever_comes_first():
    async def scenario():
        async with Pair() as pd:
            pd.prefill.latency = 0.1
            body = pd_body(7, 8998)
            decode = asyncio.create_task(exchange(pd.decode.port, post("/generate", body)))
            await asyncio.sleep(0.05)
            assert not decode.done()  # waiting for the KV of room 7
            [(p_status, _, p_body)] = await exchange(pd.prefill.port, post("/generate", body))
            [(d_status, _, d_body)] = await decode
            assert (p_status, json.loads(p_body)["text"]) == (200, " t0")
            assert (d_status, json.loads(d_body)["text"]) == (200, " t0 t1 t2")
            assert pd.ledger.problems == [] and pd.ledger.rooms == {}

    run(scenario())


def test_what_a_router_gets_wrong_is_refused_or_reported():
    async def scenario():
        async with Pair() as pd:
            [(status, _, body)] = await exchange(pd.decode.port, post("/generate", {"text": "x"}))
            assert status == 400 and b"without bootstrap room id" in body
            await exchange(pd.prefill.port, post("/generate", pd_body(1, 9999)))
            await exchange(pd.decode.port, post("/generate", pd_body(1, 9999, text="other")))
            await exchange(pd.prefill.port, post("/generate", pd_body(2, 8998)))
            await exchange(pd.prefill.port, post("/generate", pd_body(2, 8998)))
            [(status, _, body)] = await exchange(
                pd.decode.port, post("/generate", pd_body(3, None))
            )
            assert status == 500 and b"KV transfer timed out" in body  # no prefill for room 3
            assert [p.split(": ", 1)[1] for p in pd.ledger.problems] == [
                "bootstrap_port 9999 is not this prefill's 8998",
                "room 1: decode body differs from the prefill's",
                "room 2 was already used by another prefill",
            ]

    run(scenario())


def test_keep_alive_pipelining_chunked_bodies_100_continue_and_connection_close():
    async def scenario():
        worker = FakeWorker("null", Ledger())
        await worker.start()
        try:
            body = json.dumps({"text": "x", "sampling_params": {"max_new_tokens": 2}}).encode()
            chunked = (
                b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"Expect: 100-continue\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
                % (5, body[:5], len(body) - 5, body[5:])
            )
            health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            stream = post("/generate", {"text": "x", "stream": True}, "Connection: close\r\n")
            answers = await exchange(worker.port, chunked + health + stream, answers=3)
            (s1, _, b1), (s2, _, _), (s3, h3, b3) = answers
            assert (s1, json.loads(b1)["text"]) == (200, " t0 t1")
            assert s2 == 200
            assert s3 == 200 and h3["connection"] == "close"
            events = sse_events(b3)
            assert events[-1] == b"[DONE]" and events[-2]["text"] == " t0 t1 t2 t3"
            [(status, _, _)] = await exchange(worker.port, b"GET /get_load HTTP/1.1\r\n\r\n")
            assert status == 404 and worker.not_found == {"GET /get_load": 1}
            assert worker.served == {"/generate": 2}
        finally:
            await worker.stop()

    run(scenario())


def test_a_stopped_worker_drops_its_open_connections():
    async def scenario():
        worker = FakeWorker("null", Ledger())
        await worker.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", worker.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await worker.stop()
        assert await reader.read() == b""  # closed by the worker, not left half-open
        writer.close()

    run(scenario())
