"""A scheduler for virtual-time runs whose sinks only record: decode tokens are counted, not
emitted one by one.

`Scheduler` calls every running sequence's sink once per decode step and walks the whole batch
each step to give each sequence the KV page its next token needs (with SGLang's default page
size of one token: a page per sequence per step): a sizing search serves millions of tokens
that way. `CountingScheduler` batches, times, retracts and finishes exactly as `Scheduler` does
(the same steps, the same step shapes, the same floating-point step times, the same pages in
use at every step) but keeps its books per event, not per token:

1. A running sequence's `generated` is ``tick + base``, ``tick`` counting the rank's decode
   steps; the batch's KV tokens are a running sum.
2. A heap holds the tick at which each sequence may finish (`max_new_tokens`, `eos_after`).
3. A sequence that joined the batch waits in a heap for the tick at which it first needs a page.
   Once given it, it is *steady*: it holds ``pages_for(kv_tokens)`` pages from then on and needs
   one more every ``page_size`` ticks, as every steady sequence with the same
   ``(prompt_len + base) mod page_size`` does. At a step, when the pool has room for every
   sequence due a page, the due ones get theirs at once, by count (`KvPages.take`); only when it
   has not are they walked one by one, in batch order, retracting as `Scheduler` does.
4. Pages are held by count (`KvPages.take`, `KvPages.give`): `seq.page_ids` stays empty, and
   `abort(..., hold_kv=True)` holds nothing back. A virtual-time run never addresses a page.

The price is the sink contract: a decoding sequence's sink hears `on_token` for its first token
and for each token at which the scheduler ends it, not for the tokens in between, and it must
not end a sequence the scheduler did not (return the reason given, or None to go on).
`seq.generated` is exact whenever a sink is called and once the sequence left the batch; while
it runs, it may lag.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from kit.perf.scheduler import CLIP_MAX_NEW_TOKENS, Mode, Phase, Scheduler, Sequence


class _Lane:
    """A running sequence's books: its place in the batch (`order`, increasing with each join),
    ``generated - tick`` (`base`), the tick after which it may finish (`finish_tick`); and, until
    it is steady, the tick before which it needs a page more (`page_tick`)."""

    __slots__ = ("base", "finish_tick", "order", "page_tick", "steady")

    def __init__(self, order: int, base: int) -> None:
        self.order = order
        self.base = base
        self.page_tick = 0
        self.finish_tick = 0
        self.steady = False


Heap = list[tuple[int, int, Sequence]]


class CountingScheduler(Scheduler):
    """`Scheduler` with per-event books; see the module docstring for its sinks' contract."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tick = 0
        # Steady sequences hold pages_for(prompt_len + base + _granted) pages: the tick of the
        # last page round.
        self._granted = -1
        self._lanes: dict[Sequence, _Lane] = {}
        # Pages each sequence holds, but for steady ones (pages_for their KV at `_granted`).
        self._pages: dict[Sequence, int] = {}
        self._orders = itertools.count()
        self._base_kv = 0  # sum over the batch of prompt_len + base
        self._page_heap: Heap = []
        self._finish_heap: Heap = []
        # Steady sequences by (prompt_len + base) mod page_size: those due a page together.
        self._steady: list[dict[Sequence, _Lane]] = [{} for _ in range(self.pool.page_size)]

    # -- the running batch -----------------------------------------------------------------

    def _join(self, seq: Sequence) -> None:
        super()._join(seq)
        lane = _Lane(next(self._orders), seq.generated - self._tick)
        self._lanes[seq] = lane
        self._base_kv += seq.prompt_len + lane.base
        self._schedule_page(seq, lane)
        end = seq.max_new_tokens
        if seq.eos_after is not None:
            end = min(end, seq.eos_after)
        self._schedule_finish(seq, lane, max(end - lane.base, self._tick + 1))

    def _leave(self, seq: Sequence) -> None:
        lane = self._lanes.pop(seq, None)
        if lane is None:
            return
        super()._leave(seq)
        seq.generated = self._tick + lane.base
        self._base_kv -= seq.prompt_len + lane.base
        if lane.steady:
            self._unsteady(seq, lane)

    def _unsteady(self, seq: Sequence, lane: _Lane) -> None:
        """Count steady `seq`'s pages in `_pages` again."""
        del self._steady[self._residue(seq, lane)][seq]
        lane.steady = False
        self._pages[seq] = self.pool.pages_for(seq.prompt_len + lane.base + self._granted)

    def _residue(self, seq: Sequence, lane: _Lane) -> int:
        return (seq.prompt_len + lane.base) % self.pool.page_size

    def _assign(self, seq: Sequence, count: int) -> bool:
        if not self.pool.take(count):
            return False
        self._pages[seq] = count
        return True

    def _held(self, seq: Sequence) -> int:
        return self._pages[seq]  # `_prepare_decode` grows no steady sequence one by one

    def _take(self, seq: Sequence, count: int) -> bool:
        if not self.pool.take(count):
            return False
        self._pages[seq] += count
        return True

    def _release(self, seq: Sequence) -> None:
        count = self._pages.pop(seq, 0)
        if count:
            self.pool.give(count)

    def _schedule_page(self, seq: Sequence, lane: _Lane) -> None:
        # kv_tokens at tick t is prompt_len + base + t; a page more is needed once that
        # passes the pages held.
        lane.page_tick = self._pages[seq] * self.pool.page_size - seq.prompt_len - lane.base + 1
        heapq.heappush(self._page_heap, (lane.page_tick, lane.order, seq))

    def _schedule_finish(self, seq: Sequence, lane: _Lane, tick: int) -> None:
        lane.finish_tick = tick
        heapq.heappush(self._finish_heap, (tick, lane.order, seq))

    def _due(self, heap: Heap, page: bool) -> list[tuple[int, Sequence]]:
        """The running sequences whose entry in `heap` is due at the current tick, as (order,
        sequence); entries of sequences that left, were rescheduled or are steady dropped."""
        due: list[tuple[int, Sequence]] = []
        while heap and heap[0][0] <= self._tick:
            tick, order, seq = heapq.heappop(heap)
            lane = self._lanes.get(seq)
            if lane is None or lane.order != order:
                continue
            if (lane.page_tick == tick and not lane.steady) if page else lane.finish_tick == tick:
                due.append((order, seq))
        return due

    def _make_steady(self, seq: Sequence, lane: _Lane) -> None:
        """`seq` holds pages_for(kv_tokens) at `_granted` now."""
        lane.steady = True
        del self._pages[seq]
        self._steady[self._residue(seq, lane)][seq] = lane

    # -- the steps -------------------------------------------------------------------------

    def _prepare_decode(self, now: float) -> list[Sequence]:
        tick, pages_for = self._tick, self.pool.pages_for
        joined = self._due(self._page_heap, page=True)
        steady = self._steady[(1 - tick) % self.pool.page_size] if self._granted < tick else {}
        need = len(steady)
        for _, seq in joined:
            need += pages_for(seq.prompt_len + self._lanes[seq].base + tick) - self._pages[seq]
        if need <= self.pool.free_pages:
            # Every sequence due a page gets it: `Scheduler._prepare_decode` would retract none.
            self.pool.take(need)
            self._granted = tick
            for _, seq in joined:
                self._make_steady(seq, self._lanes[seq])
            return list(self.running)
        # The pool is short: `Scheduler._prepare_decode` over the sequences due a page (the
        # others would do nothing there), in batch order.
        due = joined
        for seq, lane in list(steady.items()):
            self._unsteady(seq, lane)
            due.append((lane.order, seq))
        due.sort(key=lambda entry: entry[0])
        for _, seq in due:
            if seq.phase is Phase.RUNNING:
                self._grow(seq, seq.prompt_len + self._lanes[seq].base + tick, now)
        self._granted = tick
        for _, seq in due:
            if seq in self._lanes:
                self._make_steady(seq, self._lanes[seq])
        return list(self.running)

    def _decode_context(self, decode: list[Sequence]) -> int:
        # `decode` is the whole batch, or empty (a prefill step without mixed chunks).
        return self._base_kv + self._tick * len(decode) if decode else 0

    def _running_future(self) -> int:
        # `Scheduler._future_tokens` of each running sequence, with its `generated` counted.
        if self.mode is not Mode.NULL:
            return 0
        tick, ratio = self._tick, self.new_token_ratio
        return sum(
            int(min(s.max_new_tokens - tick - lane.base, CLIP_MAX_NEW_TOKENS) * ratio)
            for s, lane in self._lanes.items()
        )

    def _advance(self) -> None:
        self._tick += 1
        self.stats.generated_tokens += len(self.running)

    def _emit_decoded(self, decode: list[Sequence], now: float) -> None:
        due = self._due(self._finish_heap, page=False)
        due.sort(key=lambda entry: entry[0])
        for _, seq in due:
            lane = self._lanes.get(seq)
            if lane is None:
                continue  # a sink ended it meanwhile
            seq.generated = self._tick + lane.base
            if not self._heard(seq, now):
                # The sink let it go on (a suppressed end of answer): ask again next token.
                self._schedule_finish(seq, lane, self._tick + 1)
