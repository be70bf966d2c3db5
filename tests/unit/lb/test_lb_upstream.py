"""The router's HTTP/1.1 client (kit.lb.upstream) against a scripted server on a real socket:
answers split at every byte, keep-alive reuse, a worker that closes, an exchange aborted."""

from __future__ import annotations

import asyncio

import pytest

from kit.lb.upstream import Upstream, UpstreamError
from tests.support.lb_cluster import run

STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b"d\r\ndata: first\n\n\r\ne\r\ndata: second\n\n\r\n0\r\n\r\n"
)
WHOLE = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{"a":1}'


class Scripted:
    """A server that answers each request on a connection with the next script entry, written
    one byte at a time (`split`), and counts connections."""

    def __init__(self, answers: list[bytes], split: bool = True) -> None:
        self.answers = list(answers)
        self.split = split
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer == b"hang":
                    await asyncio.sleep(30)
                pieces = [answer[i : i + 1] for i in range(len(answer))] if self.split else [answer]
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                if b"connection: close" in answer.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def _post(upstream: Upstream, url: str, body: bytes = b"{}") -> object:
    origin = upstream.origin(url)
    head = origin.request_head(b"POST", b"/generate") + b"Content-Length: %d\r\n\r\n" % len(body)
    conn = await origin.send(head, body)
    await conn.head()
    return conn


def test_answers_split_at_every_byte_arrive_whole_and_the_connection_is_reused():
    async def scenario():
        script = Scripted([STREAM, WHOLE])
        async with script as url:
            upstream = Upstream(connect_timeout=1, keepalive=5)
            conn = await _post(upstream, url)
            assert conn.status == 200 and conn.content_type == "text/event-stream"
            pieces = [await conn.first()]
            while not await conn.relay(pieces.append):
                conn.resume_reading()
            assert b"".join(pieces) == b"data: first\n\ndata: second\n\n"
            conn.release()
            conn = await _post(upstream, url)
            assert await conn.read() == b'{"a":1}' and conn.content_type == "application/json"
            conn.release()
            assert script.connections == 1
            assert script.requests[0].startswith(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:")
            await upstream.close()

    run(scenario())


def test_connection_close_and_a_body_to_the_end_of_the_connection():
    async def scenario():
        until_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it"
        script = Scripted([until_close], split=False)
        async with script as url:
            upstream = Upstream(connect_timeout=1, keepalive=5)
            conn = await _post(upstream, url)
            assert await conn.read() == b"all of it"
            conn.release()
            script.answers.append(WHOLE)
            conn = await _post(upstream, url)
            assert await conn.read() == b'{"a":1}'
            conn.release()
            assert script.connections == 2
            await upstream.close()

    run(scenario())


def test_a_worker_that_closes_mid_answer_is_an_error_not_a_short_body():
    async def scenario():
        cut = b'HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\n{"a"'
        async with Scripted([cut], split=False) as url:
            upstream = Upstream(connect_timeout=1, keepalive=5)
            conn = await _post(upstream, url)
            with pytest.raises(UpstreamError, match="closed the connection") as caught:
                await conn.read()
            assert not caught.value.unsent
            conn.release()
            await upstream.close()

    run(scenario())


def test_an_aborted_exchange_raises_what_it_was_aborted_with_and_closes():
    async def scenario():
        script = Scripted([b"hang"])
        async with script as url:
            upstream = Upstream(connect_timeout=1, keepalive=5)
            origin = upstream.origin(url)
            head = origin.request_head(b"POST", b"/x") + b"Content-Length: 0\r\n\r\n"
            conn = await origin.send(head, b"")
            asyncio.get_running_loop().call_later(0.05, conn.abort, TimeoutError())
            with pytest.raises(TimeoutError):
                await conn.head()
            conn.release()
            await asyncio.sleep(0.05)
            assert conn.transport is None  # closed, not back in the pool
            await upstream.close()

    run(scenario())


def test_a_worker_that_cannot_be_reached_is_an_unsent_error():
    async def scenario():
        async with Scripted([]) as url:
            pass  # the server is gone: its port refuses connections
        upstream = Upstream(connect_timeout=1, keepalive=5)
        with pytest.raises(UpstreamError) as caught:
            await _post(upstream, url)
        assert caught.value.unsent
        await upstream.close()

    run(scenario())


def test_max_connections_makes_the_next_request_wait_for_a_free_one():
    async def scenario():
        script = Scripted([WHOLE, WHOLE], split=False)
        async with script as url:
            upstream = Upstream(connect_timeout=1, keepalive=5, max_connections=1)
            first = await _post(upstream, url)
            second = asyncio.create_task(_post(upstream, url))
            await asyncio.sleep(0.05)
            assert not second.done()
            assert await first.read() == b'{"a":1}'
            first.release()
            conn = await asyncio.wait_for(second, 1)
            assert await conn.read() == b'{"a":1}'
            conn.release()
            assert script.connections == 1
            await upstream.close()

    run(scenario())
