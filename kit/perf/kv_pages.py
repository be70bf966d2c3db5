"""The KV cache of one scheduler: a pool of pages of ``page_size`` tokens.

Pages have indices so that a decode can tell a prefill where in its registered receive buffer
a request's KV goes (page i lives at ``base + i x page_bytes``), as SGLang's decode sends its
KV page indices to the prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

from kit.perf.timing import pages


class KvPages:
    """Fixed pool of `total_pages` pages; allocation costs the pages taken, not the pool's size."""

    def __init__(self, total_pages: int, page_size: int) -> None:
        if total_pages < 1:
            raise ValueError("a KV pool needs at least one page")
        self.page_size = page_size
        self.total_pages = total_pages
        # Freed pages are handed out again first, popped from the end of `_freed` (a freed
        # block comes back in ascending, contiguous order), then pages never used, ascending
        # from `_fresh`: a request's KV stays in few runs (few Mooncake writes, a short
        # reservation message). The never-used pages are not listed: a big instance has
        # millions of pages (a free list of them took GBs for an EP deployment's ranks).
        self._freed: list[int] = []
        self._fresh = 0
        # Pages taken by count (`take`), without indices.
        self._counted = 0

    @property
    def capacity_tokens(self) -> int:
        return self.total_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return len(self._freed) + self.total_pages - self._fresh - self._counted

    @property
    def free_tokens(self) -> int:
        return self.free_pages * self.page_size

    @property
    def used_pages(self) -> int:
        return self.total_pages - self.free_pages

    def usage(self) -> float:
        """Fraction of pages in use (0..1)."""
        return self.used_pages / self.total_pages

    def pages_for(self, tokens: int) -> int:
        return pages(tokens, self.page_size)

    def alloc(self, count: int) -> list[int] | None:
        """Take `count` pages, or None (and take nothing) when fewer are free."""
        if count > self.free_pages:
            return None
        if count == 0:
            return []
        reused = min(count, len(self._freed))
        taken = self._freed[len(self._freed) - reused :]
        del self._freed[len(self._freed) - reused :]
        taken.reverse()
        fresh = count - reused
        taken.extend(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        return taken

    def take(self, count: int) -> bool:
        """Take `count` pages by count, without indices (`give` returns them): for a
        scheduler whose sequences' pages are never addressed (`CountingScheduler`). False
        (and nothing taken) when fewer are free."""
        if count > self.free_pages:
            return False
        self._counted += count
        return True

    def give(self, count: int) -> None:
        """Return `count` pages taken by `take`."""
        if count > self._counted:
            raise ValueError(f"{count} pages given back, {self._counted} taken by count")
        self._counted -= count

    def free(self, page_ids: Sequence[int]) -> None:
        self._freed.extend(reversed(page_ids))


def page_runs(page_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Group page indices into (first page, page count) runs of consecutive indices."""
    runs: list[tuple[int, int]] = []
    for page in page_ids:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs
