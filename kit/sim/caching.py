"""Which prompt tokens a request finds cached, and what it leaves cached: the worker's prompt
caching, in one of two forms.

1. With --kv-events-config (and the radix cache on): a radix cache per DP rank that
   publishes SGLang's KV events (`kit.sim.prefix_cache`). A request is matched against its
   rank's cache when the scheduler takes it into a prefill batch (`match_prefix`); its prompt
   is cached once prefilled, or on a worker without PD once finished (`cache_prompt`).
   HiCache's tiers are not emulated then.
2. Otherwise, with HiCache on (--enable-hierarchical-cache) on a worker that is not a decode:
   the instance's pages (L1 and L2 as one LRU) and, with --hicache-storage-backend mooncake,
   the KV pool as L3 (`kit.sim.prefix`). A request takes its leading pages from them before
   it is queued (`load_prefix`); once prefilled, its pages are cached here and the new ones
   written through to the pool.

`stats` counts the prompt tokens by where they came from, for the worker's metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kit.kvevents.publisher import Publisher
from kit.perf.clock import RealClock
from kit.perf.scheduler import Mode, Sequence
from kit.perf.timing import TimingModel
from kit.sim import trace
from kit.sim.args import WorkerArgs
from kit.sim.prefix import STORAGE_BACKEND_TYPE, LocalCache, PoolClient, page_keys
from kit.sim.prefix_cache import PrefixCache
from kit.sim.requests import RequestState


@dataclass
class CacheStats:
    """Prompt tokens by where they came from (prefill side, HiCache on)."""

    device_tokens: int = 0  # found on the instance (L1 + L2)
    storage_tokens: int = 0  # loaded from the KV pool (L3)
    lookups: int = 0


class Caching:
    """The prompt caching of one worker, all its DP ranks (see the module docstring). The
    pool (`pool`) is joined by `Engine.start_kv_pool`."""

    def __init__(
        self,
        args: WorkerArgs,
        clock: RealClock,
        timing: TimingModel,
        *,
        mode: Mode,
        ranks: int,
        pages_per_rank: int,
        kv_bytes_per_token: int,
        spawn: Callable[[Coroutine[Any, Any, None], RequestState], None],
    ) -> None:
        self._args = args
        self._clock = clock
        self._timing = timing
        self._spawn = spawn  # a task of `state`'s (cancelled with it)
        # The radix cache per rank that publishes KV events (kit.sim.prefix_cache); where it
        # is on, it decides what is cached and HiCache's tiers below are not emulated.
        self.caches: list[PrefixCache] | None = None
        if args.kv_events is not None and args.radix_cache:
            self.caches = [
                PrefixCache(
                    args.page_size,
                    pages_per_rank,
                    Publisher(args.kv_events.endpoint, args.kv_events.topic, rank),
                )
                for rank in range(ranks)
            ]
        # HiCache (kit.sim.prefix): the instance's prefix cache, and the pool as its L3.
        self.prefix_cache: LocalCache | None = None
        hicache = args.enable_hierarchical_cache and not args.disable_radix_cache
        if hicache and mode is not Mode.DECODE:
            # L1 (GPU) and L2 (host, --hicache-ratio x the GPU pool) as one LRU.
            ratio = max(1.0, args.hicache_ratio or 2.0)
            self.prefix_cache = LocalCache(int(pages_per_rank * ranks * ratio))
        self.pool: PoolClient | None = None
        self.stats = CacheStats()
        self.namespace = (
            f"pdkit-sim:{args.served_model_name}:{args.kv_cache_dtype}:{args.page_size}:"
            f"{kv_bytes_per_token}"
        )

    def close(self) -> None:
        for cache in self.caches or ():
            cache.close()
        if self.pool is not None:
            self.pool.close()

    def match_prefix(self, state: RequestState, seq: Sequence, rank_index: int, mode: Mode) -> None:
        """Start `seq` past the prefix its rank has cached (kit.sim.prefix_cache) when the
        rank's scheduler takes it into a prefill batch, as SGLang 0.5.23 does
        (`get_new_batch_prefill`), not when it is queued; the cache takes the prompt once
        prefilled (a worker of `mode` null: once finished)."""
        if self.caches is None or state.inp.health_check:
            return
        cache = self.caches[rank_index]

        def match(admitted: Sequence) -> None:
            state.cached_tokens = admitted.computed = cache.match(
                state.inp.prompt_ids, self._clock.now()
            )
            self.stats.lookups += 1
            self.stats.device_tokens += state.cached_tokens

        seq.on_admit = match
        if mode is Mode.NULL:
            hook = state.finished_hook

            def cache_prompt(st: RequestState) -> None:
                self.cache_prompt(st, rank_index)
                if hook is not None:
                    hook(st)

            state.finished_hook = cache_prompt

    def cache_prompt(self, state: RequestState, rank_index: int) -> None:
        """The rank's radix cache takes a prompt computed (not one aborted, nor a probe's)."""
        aborted = state.finish is not None and state.finish.kind == "abort"
        if self.caches is not None and not state.inp.health_check and not aborted:
            self.caches[rank_index].insert(state.inp.prompt_ids)

    async def load_prefix(self, state: RequestState, seq: Sequence) -> None:
        """HiCache: take the prompt's leading pages from the instance's cache, then from the
        pool (fetched for real, charged the timing model's load time over the pool's link),
        so that only the rest is computed; once computed, every page is cached here and the
        new ones are written through to the pool. SGLang computes at least the last token, so
        the page holding it is never taken from a cache."""
        cache = self.prefix_cache
        if cache is None or self.caches is not None or state.inp.health_check or state.done:
            return
        page = self._args.page_size
        keys = page_keys(state.inp.prompt_ids[: seq.prompt_len - 1], page, self.namespace)
        local = cache.match(keys)
        stored = 0
        pool = self.pool
        if pool is not None and local < len(keys):
            loop = asyncio.get_running_loop()
            started_model, started_wall = self._clock.now(), loop.time()
            stored = await pool.lookup(keys[local:])
            if stored:
                modeled = self._timing.kv_transfer_seconds(
                    stored * page, rdma=pool.settings.protocol == "rdma"
                )
                wait = self._clock.wall(started_model + modeled) - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                trace.stage(state, "prefill_storage_load", started_wall)
        self.stats.lookups += 1
        self.stats.device_tokens += local * page
        self.stats.storage_tokens += stored * page
        seq.computed = (local + stored) * page
        details: dict[str, Any] = {"device": local * page, "host": 0}
        if pool is not None:
            details |= {"storage": stored * page, "storage_backend": STORAGE_BACKEND_TYPE}
        state.cached_details = details if seq.computed else None
        state.cached_tokens = seq.computed
        fresh = keys[local + stored :]
        then = state.prefilled_hook

        def prefilled(st: RequestState) -> None:
            cache.insert(keys)
            if pool is not None and fresh:
                self._spawn(pool.write(fresh), st)
            then(st)

        state.prefilled_hook = prefilled
