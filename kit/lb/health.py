"""Active health probing of workers.

`evaluate` is a pure function over one probe's outcome; `HealthMonitor` runs one small loop per
worker that probes at the time the pool scheduled (`Worker.next_probe_at`) and feeds the result
back to the pool. A passive ejection (connection error on a request) reschedules the probe to
the end of its backoff and wakes the loop. A probe that times out while the worker is busy
finishing requests (`WorkerPool.busy`) is not counted: SGLang answers /health with a one-token
generate that waits behind the running batch (it gives up itself after 20 s), so a loaded
worker answers late without being sick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp

from kit.lb.workers import Worker, WorkerPool
from kit.net import classify_failure

log = logging.getLogger("kit.lb.health")


def evaluate(status: int | None, body: bytes, error: str | None = None) -> tuple[bool, str]:
    """(healthy, detail) for one probe: `status` None means no HTTP answer, `error` says why.

    SGLang answers /health with 200 once warmed up, and 503 while starting or shutting down.
    """
    if status is None:
        return False, error or "no answer"
    if 200 <= status < 300:
        return True, f"HTTP {status}"
    snippet = body[:200].decode("utf-8", "replace").strip()
    return False, f"HTTP {status}" + (f": {snippet}" if snippet else "")


class HealthMonitor:
    """Probes every worker of the pool on its schedule, through the shared client session."""

    def __init__(
        self,
        pool: WorkerPool,
        session: aiohttp.ClientSession,
        *,
        path: str,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._pool = pool
        self._session = session
        self._path = path
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._headers = headers or {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake: dict[str, asyncio.Event] = {}

    def watch(self, worker: Worker) -> None:
        """Start probing `worker` now."""
        if worker.url in self._tasks:
            return
        self._wake[worker.url] = asyncio.Event()
        self._tasks[worker.url] = asyncio.create_task(
            self._run(worker), name=f"health {worker.url}"
        )

    def wake(self, worker: Worker) -> None:
        """Re-read the worker's schedule (after a passive ejection changed it)."""
        event = self._wake.get(worker.url)
        if event is not None:
            event.set()

    async def unwatch(self, url: str) -> None:
        task = self._tasks.pop(url, None)
        self._wake.pop(url, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        for url in list(self._tasks):
            await self.unwatch(url)

    async def probe(self, worker: Worker) -> tuple[bool, str, bool]:
        """One probe of `worker`'s health path: (healthy, detail, timed out)."""
        try:
            async with self._session.get(
                worker.url + self._path, timeout=self._timeout, headers=self._headers
            ) as resp:
                body = await resp.read()
                return (*evaluate(resp.status, body), False)
        except TimeoutError:
            return (*evaluate(None, b"", f"no answer within {self._timeout.total:g} s"), True)
        except aiohttp.ClientError as exc:
            _, why = classify_failure(exc, sent=True, timeout=self._timeout.total or 0.0)
            return (*evaluate(None, b"", why), False)

    async def _run(self, worker: Worker) -> None:
        wake = self._wake[worker.url]
        while True:
            delay = worker.next_probe_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await wake.wait()
                wake.clear()
                continue
            ok, detail, timed_out = await self.probe(worker)
            if self._pool.get(worker.url) is not worker:
                return  # removed while probing
            was = worker.state
            now = time.monotonic()
            if timed_out and self._pool.busy(worker, now):
                self._pool.record_busy_probe(worker, detail, now)
                continue
            self._pool.record_probe(worker, ok, detail, now)
            if not ok and worker.failed_probes == 1 and was is worker.state:
                log.debug("probe of %s failed: %s", worker.url, detail)
