"""What each prefill has cached, from its KV events (SGLang 0.5.23, `kit.kvevents`).

One `WorkerCache` per worker that publishes events, one `RankCache` per DP rank of it: the set
of block hashes its radix cache holds, kept from BlockStored / BlockRemoved /
AllBlocksCleared. A request's cached prefix on a rank is the number of its leading block hashes
(`kit.kvevents.blocks`, at the worker's block size) found there, times the block size, capped
at ``len - 1`` tokens as SGLang caps its match.

Pending blocks: a worker reports a prompt's blocks only once it has computed them, so a request
routed while the first one with its prefix is still waiting or prefilling would see nothing
cached anywhere. When the policy sends a request to a rank, the rank's index records the
prompt's blocks it does not hold yet as pending (`RankCache.expect`); a prefix lookup counts a
pending block as cached. A pending record ends:
* confirmed: a BlockStored on that rank carries its last block (the prefill has computed the
  whole prompt; the blocks are now simply cached);
* dropped: the request's prefill leg fails, or it was answered and no event confirmed it
  within `SERVED_GRACE_S` (events trail the answer by a little), or `pending_s` after it was
  routed, whichever is first;
* dropped with the rank's cached blocks, by every rule below.

Never stale, by these rules:
* a gap in a rank's sequence numbers (lost batches) clears that rank: what follows the gap is
  all known to be true, what came before may have been evicted unseen;
* a sequence number lower than the last (the publisher restarted) clears the rank;
* the subscriber losing its connection, or the worker leaving the routable set (unhealthy,
  removed, restarting), clears the worker and marks it not `live`;
* silence: `silence_requests` requests routed to a worker since its last event that should
  have made it store blocks (each had blocks pending there), the first of them more than
  `silence_s` ago, and the worker is not `live` until its next event (events stopped: the
  router routes as if it knew nothing). A request whose prompt the index already holds
  whole stores nothing new, so the worker publishes nothing for it: a worker serving only
  cache hits is not silent.
Each of these drops the rank's (the worker's) pending blocks as well as its cached ones.
A worker that is not `live` predicts nothing and the policy falls back (`kit.lb.policies`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import zmq
import zmq.asyncio
from yarl import URL

from kit.kvevents import wire
from kit.kvevents.blocks import BlockHasher

log = logging.getLogger(__name__)

INFO_TRIES = 5
INFO_RETRY_S = 1.0
"""A worker that just became healthy is asked for its /server_info this often, this far apart."""

SERVED_GRACE_S = 1.0
"""Seconds a pending record outlives its request's answered prefill leg, waiting for the
BlockStored that confirms it (SGLang publishes after the forward, but the event and the HTTP
answer travel separately)."""


@dataclass(slots=True, eq=False)
class Pending:
    """The blocks a rank is expected to store for one request routed to it (module docstring).

    `hashes` are the prompt's blocks the rank did not hold when it was routed; `deadline` is
    monotonic seconds; `state` is pending, confirmed or dropped."""

    rank: RankCache
    hashes: list[int]
    deadline: float
    on_confirmed: Callable[[], None] | None = None
    state: str = "pending"

    def end(self, state: str) -> None:
        """Confirmed or dropped: what it held is let go (its deadline entry lingers)."""
        self.state = state
        self.hashes = []
        self.on_confirmed = None


@dataclass
class RankCache:
    """One DP rank's cached blocks, as its events said, and the blocks routed requests will
    store there (pending)."""

    blocks: set[int] = field(default_factory=set)
    last_seq: int | None = None
    gaps: int = 0
    restarts: int = 0
    # Pending block hash -> requests expecting it; last block hash -> their records.
    pending: dict[int, int] = field(default_factory=dict)
    awaiting: dict[int, list[Pending]] = field(default_factory=dict)
    confirmed: int = 0
    dropped: int = 0

    def clear(self) -> None:
        """Forget every block, cached or pending."""
        self.blocks.clear()
        for records in self.awaiting.values():
            for record in records:
                record.end("dropped")
                self.dropped += 1
        self.awaiting.clear()
        self.pending.clear()

    def expect(
        self,
        hashes: Sequence[int],
        deadline: float,
        on_confirmed: Callable[[], None] | None = None,
    ) -> Pending | None:
        """Record `hashes` (a prompt's leading blocks, in order) as pending until `deadline`;
        None when the rank already holds them all."""
        if not hashes or hashes[-1] in self.blocks:
            return None
        new = [h for h in hashes if h not in self.blocks]
        record = Pending(self, new, deadline, on_confirmed)
        pending = self.pending
        for h in new:
            pending[h] = pending.get(h, 0) + 1
        self.awaiting.setdefault(hashes[-1], []).append(record)
        return record

    def drop(self, record: Pending) -> None:
        """End a pending record without its blocks (failed, expired)."""
        if record.state != "pending":
            return
        records = self.awaiting.get(record.hashes[-1])
        if records is not None:
            records.remove(record)
            if not records:
                del self.awaiting[record.hashes[-1]]
        self._unref(record)
        record.end("dropped")
        self.dropped += 1

    def _unref(self, record: Pending) -> None:
        pending = self.pending
        for h in record.hashes:
            left = pending.get(h, 0) - 1
            if left > 0:
                pending[h] = left
            else:
                pending.pop(h, None)

    def _stored(self, hashes: Sequence[int]) -> None:
        self.blocks.update(hashes)
        if not self.awaiting:
            return
        for h in hashes:
            records = self.awaiting.pop(h, None)
            if records is None:
                continue
            for record in records:
                self._unref(record)
                confirmed = record.on_confirmed
                record.end("confirmed")
                self.confirmed += 1
                if confirmed is not None:
                    confirmed()

    def receive(self, seq: int, batch: wire.KVEventBatch) -> None:
        """Apply one batch numbered `seq` (see the module docstring for gaps and restarts)."""
        if self.last_seq is not None:
            if seq > self.last_seq + 1:
                self.gaps += 1
                self.clear()
            elif seq <= self.last_seq:
                self.restarts += 1
                self.clear()
        self.last_seq = seq
        for event in batch.events:
            if isinstance(event, wire.BlockStored):
                if event.medium in (None, wire.GPU):
                    self._stored(event.block_hashes)
            elif isinstance(event, wire.BlockRemoved):
                if event.medium in (None, wire.GPU):
                    self.blocks.difference_update(event.block_hashes)
            else:
                self.clear()

    def cached_blocks(self, hashes: Sequence[int], *, pending: bool = True) -> int:
        """How many of `hashes` (a prompt's leading blocks) the rank holds in a row, counting
        pending blocks as held unless `pending` is false."""
        blocks = self.blocks
        expected = self.pending if pending else {}
        n = 0
        for h in hashes:
            if h not in blocks and h not in expected:
                break
            n += 1
        return n


@dataclass
class WorkerCache:
    """A worker's ranks and what its events say it has cached."""

    url: str
    block_size: int
    ranks: list[RankCache]
    live: bool = False
    last_event_at: float = 0.0
    # Requests routed since the last event, and when the first of them was.
    unanswered: int = 0
    unanswered_since: float = 0.0
    # Prediction quality: requests whose worker reported cached tokens, and how many agreed.
    predictions: int = 0
    agreed: int = 0
    predicted_tokens: int = 0
    prompt_tokens: int = 0
    # An emulated worker's tokenizer vocabulary (its /server_info), for text prompts.
    sim_vocab: int | None = None

    @property
    def dp_size(self) -> int:
        return len(self.ranks)

    def size(self) -> int:
        """Blocks indexed, all ranks."""
        return sum(len(r.blocks) for r in self.ranks)

    def pending_size(self) -> int:
        """Distinct blocks pending, all ranks."""
        return sum(len(r.pending) for r in self.ranks)

    def clear(self) -> None:
        for rank in self.ranks:
            rank.clear()


class KvIndex:
    """Every publishing worker's `WorkerCache`, by URL; `predict` is the policy's question."""

    def __init__(
        self, *, silence_s: float = 5.0, silence_requests: int = 8, pending_s: float = 30.0
    ) -> None:
        self.workers: dict[str, WorkerCache] = {}
        self.silence_s = silence_s
        self.silence_requests = silence_requests
        self.pending_s = pending_s
        # (deadline, tie, record): every pending record's deadline; a record whose deadline
        # was moved since is pushed again and its old entry skipped.
        self._deadlines: list[tuple[float, int, Pending]] = []
        self._tie = itertools.count()
        # Prompts share prefixes (system prompts, documents, earlier turns): their chunks'
        # hashes are kept rather than recomputed per request.
        self.block_hashes = BlockHasher()

    def add(self, url: str, block_size: int, dp_size: int) -> WorkerCache:
        cache = WorkerCache(url, block_size, [RankCache() for _ in range(dp_size)])
        self.workers[url] = cache
        return cache

    def drop(self, url: str) -> None:
        """The worker left or restarts: forget everything it had."""
        cache = self.workers.get(url)
        if cache is not None:
            cache.clear()
            cache.live = False

    def forget(self, url: str) -> None:
        self.workers.pop(url, None)

    def receive(self, url: str, rank: int, seq: int, batch: wire.KVEventBatch, now: float) -> None:
        cache = self.workers.get(url)
        if cache is None or not 0 <= rank < cache.dp_size:
            return
        cache.ranks[rank].receive(seq, batch)
        cache.live = True
        cache.last_event_at = now
        cache.unanswered = 0

    def lost(self, url: str) -> None:
        """The subscriber's connection to a rank of `url` dropped."""
        self.drop(url)

    def live(self, url: str, now: float) -> WorkerCache | None:
        """The worker's cache when it is to be believed now, else None (see silence)."""
        cache = self.workers.get(url)
        if cache is None or not cache.live:
            return None
        if (
            cache.unanswered >= self.silence_requests
            and now - cache.unanswered_since > self.silence_s
        ):
            log.warning("KV events: %s went silent; routing without its index", url)
            cache.clear()
            cache.live = False
            return None
        return cache

    def predict(
        self,
        cache: WorkerCache,
        prompt: Sequence[int],
        memo: dict[int, list[int]] | None = None,
        *,
        pending: bool = True,
    ) -> list[int]:
        """Cached prompt tokens on each DP rank of `cache`'s worker, pending blocks counted
        unless `pending` is false. `memo` keeps the prompt's block hashes per block size
        across the workers of one request (hashed once)."""
        usable = (len(prompt) - 1) // cache.block_size
        if usable <= 0:
            return [0] * cache.dp_size
        memo = {} if memo is None else memo
        hashes = memo.get(cache.block_size)
        if hashes is None:
            hashes = memo[cache.block_size] = self.block_hashes(prompt, cache.block_size, usable)
        return [r.cached_blocks(hashes, pending=pending) * cache.block_size for r in cache.ranks]

    def expect(
        self,
        cache: WorkerCache,
        rank: int,
        hashes: Sequence[int],
        now: float,
        on_confirmed: Callable[[], None] | None = None,
    ) -> Pending | None:
        """A request with these leading block hashes was routed to `rank` of `cache`'s worker:
        its blocks are pending there (see the module docstring); None when all are cached."""
        record = cache.ranks[rank].expect(hashes, now + self.pending_s, on_confirmed)
        if record is not None:
            heapq.heappush(self._deadlines, (record.deadline, next(self._tie), record))
        return record

    def settle(self, record: Pending, served: bool, now: float) -> None:
        """The record's prefill leg ended: failed, its blocks will not come; answered, they
        have `SERVED_GRACE_S` left to be confirmed."""
        if record.state != "pending":
            return
        if not served:
            record.rank.drop(record)
        elif now + SERVED_GRACE_S < record.deadline:
            record.deadline = now + SERVED_GRACE_S
            heapq.heappush(self._deadlines, (record.deadline, next(self._tie), record))

    def expire(self, now: float) -> None:
        """Drop the pending records whose deadline has passed."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, _, record = heapq.heappop(deadlines)
            if record.state == "pending" and record.deadline == deadline:
                record.rank.drop(record)

    def routed(self, url: str, now: float) -> None:
        """A request that should make `url` store blocks went there (for the silence rule)."""
        cache = self.workers.get(url)
        if cache is None:
            return
        if cache.unanswered == 0:
            cache.unanswered_since = now
        cache.unanswered += 1

    def observed(self, url: str, prompt_tokens: int, predicted: int, actual: int) -> None:
        """The worker answered with its real cached tokens for a prediction."""
        cache = self.workers.get(url)
        if cache is None:
            return
        cache.predictions += 1
        cache.agreed += predicted == actual
        cache.predicted_tokens += predicted
        cache.prompt_tokens += prompt_tokens


def parse_descriptor(info: dict[str, Any]) -> tuple[int, str, int, int] | None:
    """(port base, topic, block size, DP ranks) from `/server_info`'s ``kv_events``, or None
    when the worker publishes none (or none a router can reach: not zmq over TCP)."""
    kv = info.get("kv_events")
    if not isinstance(kv, dict) or kv.get("publisher") != "zmq":
        return None
    try:
        base = int(kv["endpoint_port_base"])
        block = int(kv["block_size"])
        dp = int(kv.get("dp_size") or 1)
    except (KeyError, TypeError, ValueError):
        return None
    if block <= 0 or dp <= 0:
        return None
    return base, str(kv.get("topic") or ""), block, dp


class KvSubscriber:
    """Subscribes to every prefill's publishers and feeds the `KvIndex`.

    `watch(url, host)` (the worker became routable): read its `/server_info`, open one SUB per
    DP rank at ``tcp://host:base + rank`` and apply what arrives; `unwatch(url)` (it left or is
    out): close them and drop its entries. A watched worker is re-read on every `watch`, so a
    restart with other settings is picked up."""

    def __init__(
        self,
        index: KvIndex,
        session: aiohttp.ClientSession,
        *,
        timeout: float,
        headers: dict[str, str],
        clock: Any,
    ) -> None:
        self.index = index
        self._session = session
        self._timeout = timeout
        self._headers = headers
        self._clock = clock
        self._ctx = zmq.asyncio.Context.instance()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def watch(self, url: str, host: str) -> None:
        self.unwatch(url)
        self._tasks[url] = asyncio.create_task(self._run(url, host), name=f"kv-events {url}")

    def unwatch(self, url: str) -> None:
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
        self.index.drop(url)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _server_info(self, url: str) -> dict[str, Any] | None:
        try:
            async with self._session.get(
                URL(url + "/server_info"),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                headers=self._headers,
            ) as response:
                if response.status != 200:
                    return None
                data = await response.json(content_type=None)
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _run(self, url: str, host: str) -> None:
        info = await self._server_info(url)
        for _ in range(INFO_TRIES - 1):  # a busy worker may answer /server_info late
            if info is not None:
                break
            await asyncio.sleep(INFO_RETRY_S)
            info = await self._server_info(url)
        descriptor = parse_descriptor(info) if info is not None else None
        if descriptor is None:
            self.index.forget(url)
            return
        base, topic, block_size, dp = descriptor
        cache = self.index.add(url, block_size, dp)
        sim = info.get("sim") if info is not None else None
        if isinstance(sim, dict) and isinstance(sim.get("vocab"), int):
            cache.sim_vocab = sim["vocab"]
        sockets: list[zmq.asyncio.Socket] = []
        monitors: list[zmq.asyncio.Socket] = []
        try:
            poller = zmq.asyncio.Poller()
            for rank in range(dp):
                sub = self._ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
                monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                sub.connect(f"tcp://{host}:{base + rank}")
                sockets.append(sub)
                monitors.append(monitor)
                poller.register(sub, zmq.POLLIN)
                poller.register(monitor, zmq.POLLIN)
            log.info("KV events: subscribed to %s (%d rank(s), block size %d)", url, dp, block_size)
            while True:
                for socket, _ in await poller.poll():
                    if socket in monitors:
                        await socket.recv_multipart()
                        log.warning("KV events: lost %s's publisher; its index is dropped", url)
                        self.index.lost(url)
                        continue
                    rank = sockets.index(socket)
                    message = await socket.recv_multipart()
                    try:
                        _, seq, batch = wire.parse(message)
                    except wire.WireError as exc:
                        log.warning("KV events from %s rank %d: %s", url, rank, exc)
                        continue
                    self.index.receive(url, rank, seq, batch, self._clock())
        finally:
            for sub in sockets:
                sub.disable_monitor()
                sub.close(linger=0)
            for monitor in monitors:
                monitor.close(linger=0)
