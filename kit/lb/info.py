"""Informational routes that ask the workers: /v1/models, /model_info, /server_info, /flush_cache.

`/v1/models` and `/model_info` come from one worker (healthy prefills first, then the others);
`/server_info` and `/flush_cache` ask every worker concurrently and report each one's answer or
error, with a status that says whether any (server_info) or all (flush_cache) succeeded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from kit.lb.errors import ApiError
from kit.lb.workers import Worker, WorkerPool
from kit.net import classify_failure

log = logging.getLogger("kit.lb")

SIM_VOCAB_RETRY_S = 1.0
"""How often the workers are asked for the emulated model's vocabulary until one says it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One worker's answer: HTTP status and body, or `error` when there was none."""

    worker: Worker
    status: int | None
    body: bytes
    content_type: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            return self.body[:500].decode("utf-8", "replace")

    def problem(self) -> str:
        if self.error is not None:
            return self.error
        return f"HTTP {self.status}: {self.body[:300].decode('utf-8', 'replace')}"


class InfoRoutes:
    """Handlers for the informational routes."""

    def __init__(
        self,
        pool: WorkerPool,
        session: aiohttp.ClientSession,
        timeout: float,
        headers: dict[str, str],
    ) -> None:
        self._pool = pool
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._headers = headers
        self._learning: asyncio.Task[None] | None = None

    async def ask(self, worker: Worker, method: str, path: str) -> Answer:
        """`method path` on one worker, never raising for network trouble."""
        try:
            async with self._session.request(
                method, worker.url + path, headers=self._headers, timeout=self._timeout
            ) as resp:
                body = await resp.read()
                return Answer(worker, resp.status, body, resp.content_type)
        except TimeoutError:
            return Answer(worker, None, b"", "", f"no answer within {self._timeout.total:g} s")
        except aiohttp.ClientError as exc:
            _, why = classify_failure(exc, sent=True, timeout=self._timeout.total or 0.0)
            return Answer(worker, None, b"", "", why)

    def _candidates(self) -> list[Worker]:
        workers = list(self._pool)
        return sorted(workers, key=lambda w: (not w.routable, w.role != "prefill"))

    async def _first_good(self, path: str) -> web.Response:
        problems = []
        for worker in self._candidates():
            answer = await self.ask(worker, "GET", path)
            if answer.ok:
                return web.Response(
                    body=answer.body,
                    status=answer.status or 200,
                    content_type=answer.content_type or "application/json",
                )
            problems.append(f"{worker.url}: {answer.problem()}")
        if not problems:
            raise ApiError(503, "no worker is configured", "no_worker")
        raise ApiError(502, f"no worker answered {path}: " + "; ".join(problems), "info_failed")

    async def models(self, request: web.BaseRequest) -> web.Response:
        return await self._first_good("/v1/models")

    async def model_info(self, request: web.BaseRequest) -> web.Response:
        return await self._first_good("/model_info")

    async def _everyone(self, method: str, path: str) -> list[Answer]:
        workers = list(self._pool)
        return list(await asyncio.gather(*(self.ask(w, method, path) for w in workers)))

    async def server_info(self, request: web.BaseRequest) -> web.Response:
        """Every worker's /server_info; `internal_states` gathers the decodes' (as SGLang's
        benchmark scripts expect)."""
        answers = await self._everyone("GET", "/server_info")
        out: dict[str, Any] = {"prefill": [], "decode": [], "internal_states": []}
        for answer in answers:
            entry: dict[str, Any] = {"url": answer.worker.url, "state": answer.worker.state.value}
            if answer.ok:
                info = answer.json()
                entry["info"] = info
                if answer.worker.role == "decode" and isinstance(info, dict):
                    out["internal_states"].extend(info.get("internal_states") or [])
            else:
                entry["error"] = answer.problem()
            out[answer.worker.role].append(entry)
        status = 200 if any(a.ok for a in answers) else 502
        return web.json_response(out, status=status)

    def learn_sim_vocab(self, found: Callable[[int], None]) -> None:
        """--prompt-tokens sim: call `found` with the emulated model's vocabulary once a worker
        has said it (`sim_vocab`), in the background."""
        self._learning = asyncio.create_task(self._learn(found))

    async def _learn(self, found: Callable[[int], None]) -> None:
        vocab = await self.sim_vocab()
        if vocab is not None:
            log.info("the emulated model's vocabulary: %d (the workers' /server_info)", vocab)
            found(vocab)

    async def sim_vocab(self, retry_s: float = SIM_VOCAB_RETRY_S) -> int | None:
        """The emulated model's vocabulary, from the first worker whose /server_info reports it
        (``sim.vocab``), asking the workers every `retry_s` until one does (every worker of a
        deployment emulates the same model); None once the router's session is closed."""
        while not self._session.closed:
            for answer in await self._everyone("GET", "/server_info"):
                info = answer.json() if answer.ok else None
                sim = info.get("sim") if isinstance(info, dict) else None
                vocab = sim.get("vocab") if isinstance(sim, dict) else None
                if isinstance(vocab, int) and vocab > 0:
                    return vocab
            await asyncio.sleep(retry_s)
        return None

    async def flush_cache(self, request: web.BaseRequest) -> web.Response:
        """POST /flush_cache to every worker; 200 only if all of them flushed."""
        answers = await self._everyone("POST", "/flush_cache")
        results = [
            {
                "url": a.worker.url,
                "role": a.worker.role,
                "ok": a.ok,
                **({} if a.ok else {"error": a.problem()}),
            }
            for a in answers
        ]
        ok = bool(answers) and all(a.ok for a in answers)
        return web.json_response({"flushed": ok, "workers": results}, status=200 if ok else 502)
