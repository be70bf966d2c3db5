"""The emulated prefill's prefix cache, as SGLang's HiCache keeps it: pages of a prompt, each
known by a hash chained over every token up to its end, held on the instance (L1 GPU and L2
host memory, one LRU here) and, with `--hicache-storage-backend mooncake`, in the cluster's
KV pool: the real Mooncake Store (L3), which every prefill of the deployment shares.

A prefill request looks its full pages up in order: those on the instance are free, those
found next in the pool are fetched from it for real (`get_batch` of the scaled page bytes,
each checked against its key, always over TCP) and charged the time the timing model gives
their emulated bytes over the link MOONCAKE_PROTOCOL names (rdma: the instance's NICs, tcp: one
host NIC); the rest are computed. Once computed, every page goes on the
instance and, write-through, the new ones into the pool (`put_batch`), so a prefix first
computed on prefill-0 is a pool hit on prefill-1.

The pool may vanish (its master killed): a failed store call marks it down for
`POOL_RETRY_S`, during which requests skip it and compute what the instance lacks (a merely
slow call, over `POOL_TIMEOUT_S`, is a miss for its request only); the worker logs it once
and its metrics count the failures. SGLang's mooncake backend behaves alike (a
failed lookup is a miss).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

POOL_TIMEOUT_S = 2.0
"""A store call slower than this counts as failed (a master gone makes some calls retry for
seconds)."""
POOL_RETRY_S = 2.0
"""How long the pool stays skipped after a failure before the next request tries it again."""
MAX_IN_FLIGHT = 4
"""Store calls queued or running at most; past it a request does without the pool."""
STORAGE_BACKEND_TYPE = "MooncakeStore"
"""What SGLang names the backend in `cached_tokens_details.storage_backend`."""


def page_keys(token_ids: Sequence[int], page_size: int, namespace: str) -> list[str]:
    """The key of every full page of `token_ids`: SHA-256 chained over the page's tokens and
    the previous page's key, so a key names the whole prefix up to its page's end.
    `namespace` keeps deployments, models and KV layouts apart in a shared pool."""
    keys: list[str] = []
    previous = namespace.encode()
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        page = token_ids[start : start + page_size]
        digest = hashlib.sha256(previous + b"|" + ",".join(map(str, page)).encode()).hexdigest()
        keys.append(digest)
        previous = digest.encode()
    return keys


def page_bytes(key: str, size: int) -> bytes:
    """The content the sim stores for a page: derived from its key, so a get can be checked."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class LocalCache:
    """The instance's own prefix cache (L1 + L2): an LRU of page keys, `capacity` pages."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._pages: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def match(self, keys: Sequence[str]) -> int:
        """How many of `keys`, from the first, the cache holds (touching them)."""
        n = 0
        for key in keys:
            if key not in self._pages:
                break
            self._pages.move_to_end(key)
            n += 1
        return n

    def insert(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._pages[key] = None
            self._pages.move_to_end(key)
        while len(self._pages) > self.capacity:
            self._pages.popitem(last=False)


@dataclass(frozen=True)
class PoolSettings:
    """A Mooncake Store client's settings (the worker's MOONCAKE_* environment)."""

    master: str
    metadata_server: str
    protocol: str
    device: str
    local_hostname: str
    global_segment_bytes: int

    @classmethod
    def from_env(cls, env: dict[str, str], default_host: str) -> PoolSettings | None:
        """The settings SGLang's `MooncakeStoreConfig.load_from_env` reads; None without
        MOONCAKE_MASTER (SGLang refuses to start then; the sim says so at start)."""
        master = env.get("MOONCAKE_MASTER")
        if not master:
            return None
        return cls(
            master=master,
            metadata_server=env.get("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            protocol=env.get("MOONCAKE_PROTOCOL", "rdma"),
            device=env.get("MOONCAKE_DEVICE", ""),
            local_hostname=env.get("MOONCAKE_LOCAL_HOSTNAME", default_host),
            global_segment_bytes=parse_size(env.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb")),
        )


def parse_size(value: str) -> int:
    """MOONCAKE_GLOBAL_SEGMENT_SIZE: bytes, or a number with `gb` (as SGLang parses it)."""
    text = value.strip().lower()
    if text.endswith("gb"):
        return int(float(text[:-2]) * (1 << 30))
    return int(text)


@dataclass
class PoolStats:
    """What the pool did for this worker (pages and calls)."""

    lookups: int = 0
    hit_pages: int = 0
    miss_pages: int = 0
    written_pages: int = 0
    failures: int = 0
    skipped: int = 0  # calls not made: the pool was down, or MAX_IN_FLIGHT calls were pending
    bytes_read: int = 0
    bytes_written: int = 0


LOCAL_BUFFER_BYTES = 16 * 1024 * 1024


class PoolClient:
    """The worker's client of the Mooncake Store: a global segment of `segment_bytes` (the
    scaled share of its host's DRAM), pages of `page_size` bytes (scaled)."""

    def __init__(self, settings: PoolSettings, page_size_bytes: int, segment_bytes: int) -> None:
        from mooncake.store import MooncakeDistributedStore  # noqa: PLC0415 (only with a pool)

        self.settings = settings
        self.page_size_bytes = page_size_bytes
        self.stats = PoolStats()
        self.down_until = 0.0
        self.last_error = ""
        # One call at a time: the store client is not known to be safe for concurrent calls
        # from several threads, and a call that never returns must not take others with it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-pool")
        self._in_flight = 0
        self._store: Any = MooncakeDistributedStore()
        # Pages move over TCP whatever MOONCAKE_PROTOCOL says (as the sim's PD transfers do);
        # the load is charged by the configured protocol's link (`Caching.load_prefix`).
        rc = self._store.setup(
            settings.local_hostname,
            settings.metadata_server,
            segment_bytes,
            LOCAL_BUFFER_BYTES,
            "tcp",
            "",
            settings.master,
        )
        if rc != 0:
            raise OSError(
                f"Mooncake Store setup failed ({rc}): master {settings.master}, metadata "
                f"{settings.metadata_server}, protocol tcp"
            )

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until

    def _failed(self, what: str) -> None:
        self.stats.failures += 1
        if self.up:
            logger.warning(
                "KV pool unreachable (%s, master %s): prefixes are recomputed; retrying in %.0f s",
                what,
                self.settings.master,
                POOL_RETRY_S,
            )
        self.last_error = what
        self.down_until = time.monotonic() + POOL_RETRY_S

    async def _call(self, what: str, fn: Any, *args: Any) -> Any:
        if self._in_flight >= MAX_IN_FLIGHT:
            # A slow store must not build a queue every later request waits behind (a call
            # that timed out still holds the thread): do without it for this request.
            self.stats.skipped += 1
            return None
        self._in_flight += 1
        call = asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        call.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.shield(call), POOL_TIMEOUT_S)
        except TimeoutError:
            # Slow, not gone (a loaded host): this request does without; a master that is gone
            # fails the next call at once (RPC_FAIL), which marks the pool down.
            self.stats.failures += 1
            logger.warning("KV pool %s took over %.0f s: treated as a miss", what, POOL_TIMEOUT_S)
            return None
        except (RuntimeError, OSError) as exc:
            self._failed(f"{what}: {exc}")
            return None

    def _done(self, _: Any) -> None:
        self._in_flight -= 1

    async def lookup(self, keys: Sequence[str]) -> int:
        """How many of `keys`, from the first, the pool holds: they are fetched for real and
        checked. 0 while the pool is down or when a call fails."""
        if not keys:
            return 0
        if not self.up:
            self.stats.skipped += 1
            return 0
        self.stats.lookups += 1
        exists = await self._call("batch_is_exist", self._store.batch_is_exist, list(keys))
        if exists is None:
            return 0
        if any(e < 0 for e in exists):
            self._failed(f"batch_is_exist returned {min(exists)}")
            return 0
        found = 0
        for e in exists:
            if e != 1:
                break
            found += 1
        if found:
            values = await self._call("get_batch", self._store.get_batch, list(keys[:found]))
            if values is None:
                return 0
            good = 0
            for key, value in zip(keys[:found], values, strict=True):
                if bytes(value) != page_bytes(key, self.page_size_bytes):
                    break
                good += 1
            found = good
        self.stats.hit_pages += found
        self.stats.miss_pages += len(keys) - found
        self.stats.bytes_read += found * self.page_size_bytes
        return found

    async def write(self, keys: Sequence[str]) -> None:
        """Write-through: put the pages of `keys` (computed here) into the pool."""
        if not keys or not self.up:
            return
        values = [page_bytes(k, self.page_size_bytes) for k in keys]
        rc = await self._call("put_batch", self._store.put_batch, list(keys), values)
        if rc is None:
            return
        if rc != 0:
            # A full pool evicts by its watermark; a put that finds no room is not a failure
            # of the pool (SGLang skips the page too).
            logger.debug("KV pool put_batch of %d pages returned %s", len(keys), rc)
            if rc == -900:
                self._failed("put_batch returned -900 (RPC failed)")
            return
        self.stats.written_pages += len(keys)
        self.stats.bytes_written += len(keys) * self.page_size_bytes

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(RuntimeError, OSError):
            self._store.close()
