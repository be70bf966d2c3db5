"""The load generator: a raw asyncio HTTP/1.1 client with keep-alive connections.

`closed_loop` measures throughput (each client sends its next request when the last is
answered), `open_loop` latency (Poisson arrivals that never wait for earlier answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.lbbench.cpu import cpu_tree_seconds


def header_int(lower_head: bytes, name: bytes) -> int:
    """An integer header from a lower-cased header block (0 when absent)."""
    pos = lower_head.find(name)
    if pos < 0:
        return 0
    end = lower_head.find(b"\r\n", pos)
    return int(lower_head[pos + len(name) : end if end >= 0 else None])


class Connection:
    """One keep-alive client connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, float | None, int]:
        """Send one request and read the whole answer.

        Returns (status, time the first body chunk arrived or None, SSE events received).
        """
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.reader, self.writer
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        first: float | None = None
        events = 0
        if b"transfer-encoding: chunked" in lower:
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                data = await reader.readexactly(size + 2)
                if first is None:
                    first = time.perf_counter()
                events += data.count(b"data:")
        else:
            data = await reader.readexactly(header_int(lower, b"content-length:"))
            events = data.count(b"data:")
        if b"connection: close" in lower:
            await self.close()
        return status, first, events

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def http_request(host: str, port: int, body: bytes, path: str = "/generate") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), host.encode(), port, len(body), body)
    )


@dataclass
class LoadResult:
    """One load phase: completed requests, errors, wall time (s), latencies and, for streams,
    times to the first chunk (s)."""

    done: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    # CPU seconds over the phase (throughput phases) of each watched process tree, by name
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0

    def pct(self, q: float, first: bool = False) -> float:
        """Percentile `q` (0-100) of the latency (or time to first chunk), seconds."""
        values = self.firsts if first else self.latencies
        if not values:
            return float("nan")
        data = sorted(values)
        return data[min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))]


def _record(
    result: LoadResult, started: float, answer: tuple[int, float | None, int], events: int
) -> None:
    status, first, got = answer
    if status == 200 and (not events or got == events):
        result.done += 1
        result.latencies.append(time.perf_counter() - started)
        if first is not None:
            result.firsts.append(first - started)
    else:
        result.errors += 1


async def _ask(conn: Connection, raw: bytes) -> tuple[int, float | None, int]:
    try:
        return await conn.request(raw)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        await conn.close()
        return 0, None, 0


async def closed_loop(
    port: int,
    body: bytes | Sequence[bytes] | Callable[[int], bytes],
    concurrency: int,
    *,
    seconds: float,
    events: int = 0,
    watch: Mapping[str, int] | None = None,
    warmup: float = 0.3,
    path: str = "/generate",
) -> LoadResult:
    """Throughput: `concurrency` clients, each sending the next request when the last is
    answered, for `seconds` after a warm-up. `cpu` holds the CPU time of each process tree in
    `watch` (name: pid), and of this load generator ("loadgen"), over exactly the measured window.

    An answer counts as an error unless its status is 200 and, when `events` > 0, it carried
    exactly that many SSE events (the tokens and `[DONE]`). A sequence of bodies is sent in
    turn, each client taking the next (prompts that differ, as a router's caches see them); a
    function gives the n-th request's body (each its own).
    """
    turn = itertools.count()
    if callable(body):
        make = body

        def next_raw() -> bytes:
            return http_request("127.0.0.1", port, make(next(turn)), path)

    else:
        raws = [
            http_request("127.0.0.1", port, b, path)
            for b in ([body] if isinstance(body, bytes) else body)
        ]

        def next_raw() -> bytes:
            return raws[next(turn) % len(raws)]

    result = LoadResult()
    connections = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    stop_at = time.perf_counter() + warmup + seconds
    measuring = False

    async def client(conn: Connection) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            answer = await _ask(conn, next_raw())
            if measuring:
                _record(result, started, answer, events)

    tasks = [asyncio.create_task(client(c)) for c in connections]
    await asyncio.sleep(warmup)
    measuring = True
    watch = dict(watch or {})
    cpu_before = {name: cpu_tree_seconds(pid) for name, pid in watch.items()}
    loadgen_before = time.process_time()
    begun = time.perf_counter()
    await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - begun
    result.cpu = {name: cpu_tree_seconds(pid) - cpu_before[name] for name, pid in watch.items()}
    result.cpu["loadgen"] = time.process_time() - loadgen_before
    for conn in connections:
        await conn.close()
    return result


async def open_loop(
    port: int, body: bytes, rate: float, count: int, *, events: int = 0, seed: int = 1
) -> LoadResult:
    """Latency: `count` requests at Poisson arrivals of `rate` per second, each on a free
    keep-alive connection, whether or not earlier ones are done (no queueing in the client)."""
    raw = http_request("127.0.0.1", port, body)
    result = LoadResult()
    idle: list[Connection] = []
    rng = random.Random(seed)

    async def one() -> None:
        conn = idle.pop() if idle else Connection("127.0.0.1", port)
        started = time.perf_counter()
        answer = await _ask(conn, raw)
        _record(result, started, answer, events)
        idle.append(conn)

    tasks = []
    begun = due = time.perf_counter()
    for _ in range(count):
        due += rng.expovariate(rate)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - begun
    for conn in idle:
        await conn.close()
    return result
