"""A load balancer in front of fake PD workers, all in the test's event loop (real sockets).

`running_cluster` starts `tests.support.fake_worker` workers sharing one Ledger and pdkit's load
balancer in front of them, and fails the test if the workers saw a PD protocol problem.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from kit.lb.config import parse_args
from kit.lb.server import LoadBalancer
from tests.support.fake_worker import FakeWorker, Ledger

# Health settings that make tests fast: probe every 50 ms, eject after 2 failures, readmit after 2.
FAST_HEALTH = [
    "--health-interval",
    "0.05",
    "--health-timeout",
    "1",
    "--eject-after-failed-probes",
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

    async def delete(self, path: str, params: dict[str, str], *, key: str | None = None) -> Any:
        """DELETE with query `params` and return (status, parsed JSON or raw bytes)."""
        hdrs = {"Authorization": f"Bearer {key}"} if key is not None else {}
        async with self.session.delete(self.url + path, params=params, headers=hdrs) as resp:
            return resp.status, _maybe_json(await resp.read())

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
