"""The KV cache of one scheduler: a pool of pages of ``page_size`` tokens.

Pages have indices so that a decode can tell a prefill where in its registered receive buffer
a request's KV goes (page i lives at ``base + i x page_bytes``), as SGLang's decode sends its
KV page indices to the prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

from kit.perf.timing import pages


class KvPool:
    """Fixed pool of `total_pages` pages; O(pages) allocation from a free list."""

    def __init__(self, total_pages: int, page_size: int) -> None:
        if total_pages < 1:
            raise ValueError("a KV pool needs at least one page")
        self.page_size = page_size
        self.total_pages = total_pages
        # The free list is popped from its end, lowest index last-in: a fresh pool and every
        # freed block hand their pages out again in ascending, contiguous order, which keeps
        # a request's KV in few runs (few Mooncake writes, a short reservation message).
        self._free = list(range(total_pages - 1, -1, -1))

    @property
    def capacity_tokens(self) -> int:
        return self.total_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.page_size

    @property
    def used_pages(self) -> int:
        return self.total_pages - len(self._free)

    def usage(self) -> float:
        """Fraction of pages in use (0..1)."""
        return self.used_pages / self.total_pages

    def pages_for(self, tokens: int) -> int:
        return pages(tokens, self.page_size)

    def alloc(self, count: int) -> list[int] | None:
        """Take `count` pages, or None (and take nothing) when fewer are free."""
        if count > len(self._free):
            return None
        if count == 0:
            return []
        taken = self._free[-count:]
        del self._free[-count:]
        taken.reverse()
        return taken

    def free(self, page_ids: Sequence[int]) -> None:
        self._free.extend(reversed(page_ids))


def page_runs(page_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Group page indices into (first page, page count) runs of consecutive indices."""
    runs: list[tuple[int, int]] = []
    for page in page_ids:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs
