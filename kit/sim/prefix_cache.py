"""The emulated radix cache of one DP rank, and the KV events it publishes.

SGLang keeps the prompts it has prefilled in a radix tree of pages and, with
``--kv-events-config``, publishes every page it adds (BlockStored), evicts (BlockRemoved) or
drops at a flush (AllBlocksCleared). This cache keeps the same pages by their block hashes
(`kit.kvevents.blocks`, computed as SGLang computes them), so that its events are byte for byte
what a real worker would send for the same prompts:

* `match(prompt)`: the cached prefix in tokens, whole pages only and at most ``len - 1`` tokens
  (the last token is always computed, as in SGLang); a hit refreshes the pages' recency.
* `insert(prompt)`: after a prefill, its whole pages join the cache (one BlockStored for the
  new pages, chained to the last page already there); past `capacity_pages`, the least
  recently used leaf pages are evicted (one BlockRemoved).
* `clear()`: `/flush_cache`.

Limits of the emulation: the cache has its own page budget (the rank's KV capacity) instead of
sharing the pool with running requests, and it is modelled only where the worker publishes
events (``--kv-events-config``), so that a sim without them keeps its timing unchanged.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from kit.kvevents import wire
from kit.kvevents.blocks import block_hashes
from kit.kvevents.publisher import Publisher

HIT_RATE_WINDOW_S = 15.0
"""SGLang 0.5.23's SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS: the window of `recent_hit_rate`."""


@dataclass
class _Page:
    parent: int | None
    children: int = 0


class PrefixCache:
    """One DP rank's cached pages (see the module docstring)."""

    def __init__(self, page_size: int, capacity_pages: int, publisher: Publisher | None) -> None:
        self.page_size = page_size
        self.capacity_pages = max(1, capacity_pages)
        self.publisher = publisher
        self._pages: OrderedDict[int, _Page] = OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self._recent: deque[tuple[float, int, int]] = deque()  # (at, cached, prompt tokens)

    def __len__(self) -> int:
        return len(self._pages)

    def match(self, prompt: Sequence[int], now: float | None = None) -> int:
        """Tokens of `prompt` already cached (whole pages, at most ``len(prompt) - 1``); a
        match at `now` counts in `recent_hit_rate`."""
        usable = (len(prompt) - 1) // self.page_size
        matched = 0
        for h in block_hashes(prompt, self.page_size, limit=usable):
            if h not in self._pages:
                break
            self._pages.move_to_end(h)
            matched += 1
        cached = matched * self.page_size
        self.hit_tokens += cached
        self.lookup_tokens += len(prompt)
        if now is not None:
            self._recent.append((now, cached, len(prompt)))
        return cached

    def recent_hit_rate(self, now: float) -> float:
        """Cached / prompt tokens of the matches in the last `HIT_RATE_WINDOW_S` (0 without
        any): what SGLang estimates a waiting request's cached share by
        (`get_num_waiting_uncached_tokens`, whose prefix match of the waiting queue is off
        with the default fcfs policy and radix cache)."""
        recent = self._recent
        while recent and recent[0][0] <= now - HIT_RATE_WINDOW_S:
            recent.popleft()
        total = sum(n for _, _, n in recent)
        return sum(c for _, c, _ in recent) / total if total else 0.0

    def insert(self, prompt: Sequence[int]) -> None:
        """Cache the whole pages of a prefilled `prompt`; publish what changed."""
        hashes = block_hashes(prompt, self.page_size)
        parent: int | None = None
        new_from = len(hashes)
        for i, h in enumerate(hashes):
            page = self._pages.get(h)
            if page is None:
                new_from = i
                break
            self._pages.move_to_end(h)
            parent = h
        events: list[wire.Event] = []
        if new_from < len(hashes):
            if parent is not None:
                self._pages[parent].children += 1
            prev = parent
            for h in hashes[new_from:]:
                self._pages[h] = _Page(prev)
                if prev is not None and prev != parent:
                    self._pages[prev].children += 1
                prev = h
            start = new_from * self.page_size
            events.append(
                wire.BlockStored(
                    block_hashes=hashes[new_from:],
                    parent_block_hash=parent,
                    token_ids=list(prompt[start : len(hashes) * self.page_size]),
                    block_size=self.page_size,
                    lora_id=None,
                    medium=wire.GPU,
                )
            )
        removed = self._evict()
        if removed:
            events.append(wire.BlockRemoved(block_hashes=removed, medium=wire.GPU))
        self._publish(events)

    def _evict(self) -> list[int]:
        removed: list[int] = []
        while len(self._pages) > self.capacity_pages:
            victim = next((h for h, p in self._pages.items() if p.children == 0), None)
            if victim is None:  # pragma: no cover - a finite tree always has a leaf
                break
            page = self._pages.pop(victim)
            if page.parent is not None and page.parent in self._pages:
                self._pages[page.parent].children -= 1
            removed.append(victim)
        return removed

    def clear(self) -> None:
        """Drop every page (`/flush_cache`)."""
        self._pages.clear()
        self._publish([wire.AllBlocksCleared()])

    def _publish(self, events: list[wire.Event]) -> None:
        if self.publisher is not None and events:
            self.publisher.publish(events)

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
