"""The decode's side of PD: find a request's prefill, ask it for the KV, watch it is alive.

For ``bootstrap_host:bootstrap_port`` the decode fetches ``GET /route`` once (server info,
then the rank that holds the room: ``room % dp_size``), like SGLang's KV receiver, then holds
the long poll ``POST /pdkit_sim/kv`` on that rank until the KV has landed. Every prefill with
waiting rooms gets a heartbeat (``GET /health`` every ``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL``
s); after ``..._HEARTBEAT_MAX_FAILURE`` failures in a row its waiting rooms fail with SGLang's
"Lost connection with prefill instance" message. A connection reset on the long poll fails
the room at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kit.net import http_url
from kit.sim.bootstrap import KV_PATH

logger = logging.getLogger(__name__)

ROUTE_RETRY_S = 0.2
# SGLang's heartbeat request timeout: (connect 2 s, read 3 s).
HEARTBEAT_TIMEOUT_S = (2.0, 3.0)


class PdError(RuntimeError):
    """A PD hand-off failed; `message` follows SGLang's wording."""


@dataclass
class _Prefill:
    addr: str
    info: dict[str, Any]
    ranks: dict[int, str] = field(default_factory=dict)
    waiting: set[asyncio.Future[None]] = field(default_factory=set)
    failures: int = 0
    heartbeat: asyncio.Task[None] | None = None


class PrefillDirectory:
    """Known prefills (by bootstrap address) and the decode's requests to them."""

    def __init__(
        self,
        *,
        bootstrap_timeout_s: float,
        waiting_timeout_s: float,
        heartbeat_interval_s: float,
        heartbeat_max_failure: int,
        heartbeat_timeout_s: tuple[float, float] = HEARTBEAT_TIMEOUT_S,
    ) -> None:
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.waiting_timeout_s = waiting_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_max_failure = heartbeat_max_failure
        connect, read = heartbeat_timeout_s
        self._heartbeat_timeout = aiohttp.ClientTimeout(sock_connect=connect, sock_read=read)
        self._session: aiohttp.ClientSession | None = None
        self._prefills: dict[str, _Prefill] = {}
        self._lookups: dict[str, asyncio.Task[_Prefill]] = {}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
            )
        return self._session

    async def close(self) -> None:
        for prefill in self._prefills.values():
            if prefill.heartbeat is not None:
                prefill.heartbeat.cancel()
        if self._session is not None:
            await self._session.close()

    async def prefill_info(self, addr: str) -> dict[str, Any]:
        """Server info of the prefill at `addr` (``host:port``); cached. Retries while the
        prefill answers 503 (still loading), up to the bootstrap timeout."""
        prefill = self._prefills.get(addr)
        if prefill is None:
            task = self._lookups.get(addr)
            if task is None or (task.done() and task.exception() is not None):
                task = asyncio.ensure_future(self._lookup(addr))
                self._lookups[addr] = task
            prefill = await asyncio.shield(task)
        return prefill.info

    async def _lookup(self, addr: str) -> _Prefill:
        deadline = time.monotonic() + self.bootstrap_timeout_s
        url = (
            f"http://{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
            "&target_tp_rank=-1&target_pp_rank=-1"
        )
        while True:
            try:
                async with self._http().get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        prefill = _Prefill(addr, await r.json())
                        self._prefills[addr] = prefill
                        return prefill
                    text = await r.text()
                    if r.status != 503:
                        raise PdError(f"Failed to get prefill server info: {r.status}, {text}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise PdError(
                    f"Could not fetch prefill parallel info from bootstrap_addr: {addr} ({exc})"
                ) from exc
            if time.monotonic() >= deadline:
                raise PdError(
                    f"Could not fetch prefill parallel info from bootstrap_addr: "
                    f"{addr} (not registered after {self.bootstrap_timeout_s:g}s)"
                )
            await asyncio.sleep(ROUTE_RETRY_S)

    async def _rank_url(self, prefill: _Prefill, dp_rank: int) -> str:
        url = prefill.ranks.get(dp_rank)
        if url is not None:
            return url
        query = f"prefill_dp_rank={dp_rank}&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
        try:
            async with self._http().get(
                f"http://{prefill.addr}/route?{query}", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                if r.status != 200:
                    raise PdError(f"Failed to get prefill rank info: {r.status}, {await r.text()}")
                rank = await r.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PdError(f"Error fetching prefill info from bootstrap: {exc}") from exc
        url = http_url(rank["rank_ip"], rank["rank_port"], KV_PATH)
        prefill.ranks[dp_rank] = url
        return url

    async def fetch_kv(self, addr: str, room: int, reservation: dict[str, Any]) -> dict[str, Any]:
        """Hold the long poll for `room` until the prefill reports the KV written; return its
        answer (``status``, ``checksum``, ``first_token_id``, ...). Raises `PdError`."""
        await self.prefill_info(addr)
        prefill = self._prefills[addr]
        dp_size = int(prefill.info.get("dp_size") or 1)
        url = await self._rank_url(prefill, room % dp_size)
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        prefill.waiting.add(lost)
        self._watch(prefill)
        start = time.monotonic()
        post = asyncio.ensure_future(self._post(url, addr, reservation))
        try:
            waits: set[asyncio.Future[Any]] = {post, lost}
            done, _ = await asyncio.wait(
                waits, timeout=self.waiting_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if post in done:
                return post.result()
            if lost in done:
                raise PdError(f"Lost connection with prefill instance (bootstrap_addr: {addr})")
            raise PdError(
                f"Request {room} timed out after {time.monotonic() - start:.1f}s in "
                "KVPoll.WaitingForInput"
            )
        finally:
            post.cancel()
            prefill.waiting.discard(lost)

    async def _post(self, url: str, addr: str, reservation: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self._http().post(
                url, json=reservation, timeout=aiohttp.ClientTimeout(total=None)
            ) as r:
                if r.content_type != "application/json":
                    raise PdError(f"the prefill answered {r.status}: {(await r.text())[:200]}")
                body: dict[str, Any] = await r.json()
        except (aiohttp.ClientError, ValueError) as exc:
            # SGLang's one wording for a prefill gone mid-request (common/conn.py:2104).
            logger.debug("sim: the long poll to %s failed: %s", url, exc)
            raise PdError(
                f"Lost connection with prefill instance (bootstrap_addr: {addr})"
            ) from exc
        if body.get("status") != "ok":
            raise PdError(str(body.get("message") or f"prefill answered {body}"))
        return body

    def _watch(self, prefill: _Prefill) -> None:
        if prefill.heartbeat is None or prefill.heartbeat.done():
            prefill.heartbeat = asyncio.ensure_future(self._heartbeat(prefill))

    async def _heartbeat(self, prefill: _Prefill) -> None:
        """SGLang's heartbeat checker, for one prefill, while it has waiting rooms."""
        while prefill.waiting:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                async with self._http().get(
                    f"http://{prefill.addr}/health", timeout=self._heartbeat_timeout
                ) as r:
                    healthy = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                healthy = False
            if not healthy:  # SGLang's line (common/conn.py:2028)
                logger.info("Attempting to reconnect to %s...", prefill.addr)
            prefill.failures = 0 if healthy else prefill.failures + 1
            if prefill.failures >= self.heartbeat_max_failure:
                logger.error(
                    "Lost connection with prefill instance (bootstrap_addr: %s), "
                    "%d requests affected",
                    prefill.addr,
                    len(prefill.waiting),
                )
                for lost in list(prefill.waiting):
                    if not lost.done():
                        lost.set_result(None)
                # Forget it: a later request looks it up again.
                self._prefills.pop(prefill.addr, None)
                self._lookups.pop(prefill.addr, None)
                return
