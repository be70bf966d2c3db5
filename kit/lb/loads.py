"""What the workers say about their load (`GET /v1/loads`), for admission: the load this router
did not send (other routers, clients that call a worker directly).

One loop polls every routable worker each `interval` s through the shared client session
(SGLang answers `{"loads": [one entry per DP rank]}`; the entries are summed) and sets, per
worker, what its numbers show beyond this router's own in-flight accounting: a prefill's
waiting prompt tokens, a decode's running requests. A worker that does not answer keeps its
last numbers until it does (admission never waits on this loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from kit.lb.admission import Admission
from kit.lb.workers import WorkerPool

log = logging.getLogger("kit.lb.loads")


def summed(body: Any, key: str) -> float | None:
    """`key` summed over the DP ranks of a /v1/loads answer; None when absent."""
    entries = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    values = [e.get(key) for e in entries if isinstance(e, dict)]
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return sum(numbers) if numbers else None


class WorkerLoads:
    """Polls /v1/loads of every routable worker and feeds `admission` what it shows."""

    def __init__(
        self,
        pool: WorkerPool,
        admission: Admission,
        session: aiohttp.ClientSession,
        *,
        interval: float,
        timeout: float,
        headers: dict[str, str],
    ) -> None:
        self._pool = pool
        self._admission = admission
        self._session = session
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._headers = headers
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loads")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            workers = [*self._pool.routable("prefill"), *self._pool.routable("decode")]
            await asyncio.gather(*(self._poll(w.url, w.role) for w in workers))
            await asyncio.sleep(self._interval)

    async def _poll(self, url: str, role: str) -> None:
        try:
            async with self._session.get(
                url + "/v1/loads", timeout=self._timeout, headers=self._headers
            ) as resp:
                if resp.status != 200:
                    return
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.debug("no /v1/loads from %s: %s", url, exc)
            return
        worker = self._pool.get(url)
        if worker is None:
            return
        if role == "prefill":
            waiting = summed(body, "num_waiting_uncached_tokens")
            if waiting is not None:
                model = self._admission.prefill_model(worker)
                model.external = max(waiting - model.queued, 0.0)
        else:
            running = summed(body, "num_running_reqs")
            if running is not None:
                self._admission.decode_model(worker).external = max(
                    int(running) - worker.inflight, 0
                )
